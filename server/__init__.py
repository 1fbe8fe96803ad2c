"""OpenAI-compatible HTTP server around `engine` (FastAPI + uvicorn). It reaches the engine only through
`engine/__init__.py`.

Starting and running: `__main__` and `cli` (the command line: serve, transcribe), `settings` (every flag and
WHISPER_* variable), `app` (the FastAPI app and its lifespan), `served_models` (each model's engine, found by the
ids requests name it by), `supervisor` (starts and restarts the engines),
`drain` (a graceful stop), `serving` (uvicorn on the app: the only front-end process, or one of several),
`frontends` (several front-end processes sharing the port and the engines), `shared_state` (what they share:
client secrets, WebRTC calls), `openmp` (OpenMP's spin count, set before torch loads), `heap` (start-up's objects out of
garbage collection), `logs` (request ids, redaction).
HTTP's edges: `deadlines` (read deadlines and the per-address connection cap), `auth` (API keys), `deps`
(what handlers take from the app's state), `errors` (OpenAI's error envelope).
Requests: `routes/` (one module per route group), `parsing/` (bodies to parameters), `protocol` (the wire
models), `chat_templates` (chat answers rendered from `chat_templates/*.jinja`).
Answers: `response_format` (its values) and `formatting` (json, text, srt, vtt and verbose_json bodies), `streaming`
(server-sent events of transcriptions), `chat_stream` (chat completions' chunks), `speakers` (diarization beside
the engine), `metrics` (Prometheus).
Live sessions: `realtime/` (the Realtime API). The playground: `ui/` (static files, served by `routes/ui`).
"""
