"""Long-form transcription: what happens between a request's audio and its segments.

- transcription.py: Whisper's sequential algorithm for one request (seek, previous-text prompt, temperature
  fallback, no-speech skipping), one window at a time.
- chunked_transcription.py: chunking_strategy: speech spans found by VAD (vad.py), packed into windows
  (span_packing.py) that all decode at once.
- segments.py: timestamp tokens to segments; alignment.py: word timestamps (alignment heads, DTW).

May import engine.model (the tokenizer), engine.audio, engine.features and engine.request; never the loop, the
runner or the backends: the loop hands finished windows (engine.sequence.Sequence) in, and takes WindowJobs out.
"""
