"""OpenAI's Realtime API (GA) for transcription sessions, over the engine's shared batch.

- audio_input.py: a session's input format (24 kHz PCM16, G.711 mu-law / A-law) decoded and resampled to the
  engine's 16 kHz by FFmpeg (PyAV), one stateful decoder and resampler per session.
- buffers.py: the input audio buffer: a session's uncommitted 16 kHz audio and the item it is to become, appends
  measured against the session's and the server's caps before they are decoded.
- turns.py: server VAD: where turns start and end (and idle timeouts) from Silero's speech probabilities.
- partials.py: when the open turn is decoded again for live deltas, and which words of those decodes are sent.
- load.py: what the sessions of a server share: sessions open, decodes in flight, audio buffered, the worker
  thread for large events.
- passes.py: work from every session run together in one worker-thread pass, beside the event loop (their small
  appends' decoding, Silero).
- session.py: the session's configuration as the SDK's models describe it: defaults, `session.update` validated
  and merged, the effective session sent back.
- events.py: the server's events as dicts of the SDK's shapes, and the protocol's errors.
- speech_batcher.py: Silero's speech probabilities for every live session in one pass (server_vad), in a process of
  its own on a GPU server.
- idle.py: a session's idle timeout, one timer per session however many events it sends.
- client_secrets.py: the ephemeral secrets an app's backend mints for a device: one connection each, then gone.
- connection.py: one session: client events in and dispatched, turns committed and transcribed through the
  engine, server events out through a bounded queue.
- transport.py: what carries a session, WebSocket or WebRTC call: events in and out, the track's audio in.
- webrtc.py: a WebRTC call (aiortc): the SDP answer to the client's offer, the `oai-events` data channel and the
  Opus microphone track as a transport.
- calls.py: the calls in progress, by id: their sessions run as tasks until the call ends or is hung up.
"""
