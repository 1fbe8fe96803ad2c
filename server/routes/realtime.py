"""GET /v1/realtime?intent=transcription: OpenAI's Realtime API (GA) for live transcription (server/realtime/)."""

from __future__ import annotations

import json

from fastapi import APIRouter, WebSocket

from ..auth import REALTIME_SUBPROTOCOL
from ..realtime.connection import Connection
from ..realtime.events import error

router = APIRouter(tags=["realtime"])


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """A transcription session (the SDK: `client.realtime.connect(extra_query={"intent": "transcription"})`). API
    keys are checked before the upgrade, as for every /v1 route (auth.APIKeyMiddleware): in the Authorization
    header, or from a browser as the subprotocol `openai-insecure-api-key.<key>`."""
    app = websocket.app
    settings, metrics, load = app.state.settings, app.state.metrics, app.state.realtime
    # a browser offers `realtime` (and its key as another subprotocol): the handshake must select one it offered
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    await websocket.accept(subprotocol=REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in offered else None)
    refusal = None
    if websocket.query_params.get("intent") != "transcription":
        refusal = error(
            "this server serves realtime transcription sessions only: connect to /v1/realtime?intent=transcription",
            code="unsupported_intent", param="intent",
        )  # fmt: skip
    elif app.state.engine is None or app.state.drain.draining:
        refusal = error("the server is not ready to transcribe", type_="server_error", code="server_not_ready")
    elif load.sessions >= settings.realtime_max_sessions:
        refusal = error(f"too many realtime sessions (at most {settings.realtime_max_sessions})",
                        code="session_limit_reached")  # fmt: skip
    if refusal is not None:
        await websocket.send_text(json.dumps(refusal))
        await websocket.close(code=1008)
        return
    load.sessions += 1
    metrics.realtime_sessions.inc()
    try:
        await Connection(websocket, app.state.engine, settings, app.state.speech, metrics, load).run()
    finally:
        load.sessions -= 1
        metrics.realtime_sessions.dec()
