"""The HTTP routes, one module per group: `audio` (transcriptions and translations), `chat` (chat completions with
audio parts), `models` (/v1/models), `health` (/health, its live and per-engine views, and /metrics), `realtime`
(the Realtime WebSocket), `ui` (the playground at /)."""
