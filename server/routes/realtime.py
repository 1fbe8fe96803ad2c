"""GET /v1/realtime?intent=transcription: OpenAI's Realtime API (GA) for live transcription (server/realtime/)."""

from __future__ import annotations

import json

from fastapi import APIRouter, WebSocket

from engine import VoiceActivityDetector

from ..realtime.connection import Connection, SharedLoad
from ..realtime.events import error

router = APIRouter(tags=["realtime"])


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """A transcription session (the SDK: `client.realtime.connect(extra_query={"intent": "transcription"})`). API
    keys are checked before the upgrade, as for every /v1 route (auth.APIKeyMiddleware)."""
    app = websocket.app
    settings, metrics = app.state.settings, app.state.metrics
    await websocket.accept()
    refusal = None
    if websocket.query_params.get("intent") != "transcription":
        refusal = error(
            "this server serves realtime transcription sessions only: connect to /v1/realtime?intent=transcription",
            code="unsupported_intent", param="intent",
        )  # fmt: skip
    elif app.state.engine is None or app.state.drain.draining:
        refusal = error("the server is not ready to transcribe", type_="server_error", code="server_not_ready")
    elif getattr(app.state, "realtime_open", 0) >= settings.realtime_max_sessions:
        refusal = error(f"too many realtime sessions (at most {settings.realtime_max_sessions})",
                        code="session_limit_reached")  # fmt: skip
    if refusal is not None:
        await websocket.send_text(json.dumps(refusal))
        await websocket.close(code=1008)
        return
    if getattr(app.state, "vad", None) is None:
        app.state.vad = VoiceActivityDetector()  # loads Silero on first use
    app.state.realtime_open = getattr(app.state, "realtime_open", 0) + 1
    metrics.realtime_sessions.inc()
    try:
        load = getattr(app.state, "realtime_load", None) or SharedLoad(settings.realtime_max_partial_decodes)
        app.state.realtime_load = load
        await Connection(websocket, app.state.engine, settings, app.state.vad, metrics, load).run()
    finally:
        app.state.realtime_open -= 1
        metrics.realtime_sessions.dec()
