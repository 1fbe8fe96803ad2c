"""Transcription: every request's state machine, between its audio and its segments (not only long audio).

- `sequential.py`: Whisper's sequential algorithm for one request (seek, previous-text prompt, temperature
  fallback, best_of, no-speech skipping), one window at a time: `Transcription`
- `chunked.py`: chunking_strategy: speech spans found by VAD (`vad.py`), packed into windows (`span_packing.py`)
  that all decode at once
- `segments.py`: timestamp tokens to segments; `alignment.py`: word timestamps (alignment heads, DTW)
- `turn_end.py`: whether a paused speaker is done (smart-turn v3.2), for the realtime API's semantic_vad
- `vad_process.py`: the realtime API's live Silero streams in a child process of their own (`SpeechStreamsProcess`)

May import engine.model (the tokenizer), engine.audio, engine.request, the window records of
engine.runtime.sequence and a child process's set-up (engine.processes.child); never the loop, the runner or the backends: the loop hands finished windows in, and takes
WindowJobs out.
"""
