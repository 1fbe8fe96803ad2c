"""OpenAI's Realtime API (GA) for transcription sessions, over the engine's shared batch.

- audio_input.py: a session's input format (24 kHz PCM16, G.711 mu-law / A-law) decoded and resampled to the
  engine's 16 kHz by FFmpeg (PyAV), one stateful decoder and resampler per session.
- session.py: the session's configuration as the SDK's models describe it: defaults, `session.update` validated
  and merged, the effective session sent back.
- events.py: the server's events as dicts of the SDK's shapes, and the protocol's errors.
- speech_batcher.py: Silero's speech probabilities for every live session in one pass (server_vad).
- connection.py: one WebSocket: client events in, transcription of committed turns through the engine, server
  events out through a bounded queue.
"""
