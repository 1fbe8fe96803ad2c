"""GET /v1/realtime?intent=transcription: OpenAI's Realtime API (GA) for live transcription (server/realtime/); POST
/v1/realtime/client_secrets: the ephemeral secrets that open one such connection from a device."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, WebSocket

from ..auth import REALTIME_SUBPROTOCOL, SECRET_SCOPE_KEY
from ..errors import APIError
from ..parsing.body import limited_request, parse_json
from ..realtime.client_secrets import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from ..realtime.connection import Connection
from ..realtime.events import error, new_id
from ..realtime.session import SessionConfig, SessionError

MAX_SECRET_BODY_BYTES = 64 * 1024  # a session configuration: its prompt is the largest part

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
    secret = websocket.scope.get(SECRET_SCOPE_KEY)  # redeemed by the key check (auth.APIKeyMiddleware)
    session = secret.session if secret is not None else None
    load.sessions += 1
    metrics.realtime_sessions.inc()
    try:
        await Connection(websocket, app.state.engine, settings, app.state.speech, metrics, load, session).run()
    finally:
        load.sessions -= 1
        metrics.realtime_sessions.dec()


@router.post("/v1/realtime/client_secrets")
async def create_client_secret(request: Request) -> dict:
    """An ephemeral secret for one realtime connection, minted with the API key (OpenAI's shape: `value`,
    `expires_at`, the effective `session`): `expires_after` {"anchor": "created_at", "seconds": 10-7200, default
    600}, and optionally the transcription `session` the connection starts with (validated now, as session.update
    validates it). server/realtime/client_secrets.py says what a secret opens and for how long."""
    app = request.app
    try:
        raw = await limited_request(request, MAX_SECRET_BODY_BYTES, MAX_SECRET_BODY_BYTES).body()
    except APIError as exc:
        raise APIError(413, f"The request body is larger than {MAX_SECRET_BODY_BYTES} bytes.",
                       code="request_too_large") from exc  # fmt: skip
    body = parse_json(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_value")
    unknown = sorted(set(body) - {"expires_after", "session"})
    if unknown:
        raise APIError(400, f"Unknown parameter: '{unknown[0]}'.", param=unknown[0], code="unknown_parameter")
    ttl_s = _ttl(body.get("expires_after"))
    config = SessionConfig(app.state.settings)
    session = body.get("session")
    if session is not None:
        try:
            config.update(session)
        except SessionError as exc:
            raise APIError(400, str(exc), param=exc.param, code=exc.code) from None
    minted = app.state.client_secrets.mint(ttl_s, session)
    if minted is None:
        raise APIError(429, "Too many unexpired client secrets on this server: try again once some have expired.",
                       code="rate_limit_exceeded")  # fmt: skip
    value, secret = minted
    effective = {"id": new_id("sess"), "object": "realtime.transcription_session", "expires_at": secret.expires_at}
    return {"value": value, "expires_at": secret.expires_at, "session": effective | config.body()}


def _ttl(expires_after: object) -> int:
    """expires_after's seconds, checked as OpenAI bounds them."""
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        raise APIError(400, "expires_after must be an object.", param="expires_after", code="invalid_type")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        raise APIError(400, "expires_after.anchor must be 'created_at'.", param="expires_after.anchor",
                       code="invalid_value")  # fmt: skip
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise APIError(400, f"expires_after.seconds must be an integer from {MIN_TTL_S} to {MAX_TTL_S}.",
                       param="expires_after.seconds", code="invalid_value")  # fmt: skip
    return seconds
