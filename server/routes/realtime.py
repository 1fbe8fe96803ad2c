"""OpenAI's Realtime API (GA) for live transcription (server/realtime/): a session over a WebSocket (GET
/v1/realtime?intent=transcription) or a WebRTC call (POST /v1/realtime/calls with the client's SDP offer; POST
/v1/realtime/calls/{id}/hangup); POST /v1/realtime/client_secrets: the ephemeral secrets that open one such
session from a device."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response, WebSocket
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..auth import REALTIME_SUBPROTOCOL, SECRET_SCOPE_KEY
from ..errors import APIError, ClientDisconnectedError
from ..parsing.body import limited_request, parse_json
from ..realtime.client_secrets import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from ..realtime.connection import Connection
from ..realtime.events import error, new_id
from ..realtime.session import SessionConfig, SessionError
from ..realtime.transport import Transport, WebSocketTransport
from ..realtime.webrtc import Call, OfferError, ice_servers

MAX_SECRET_BODY_BYTES = 64 * 1024  # a session configuration: its prompt is the largest part
MAX_OFFER_BODY_BYTES = 128 * 1024  # an SDP offer (a few KB from a browser) and a session configuration

router = APIRouter(tags=["realtime"])


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """A transcription session (the SDK: `client.realtime.connect(extra_query={"intent": "transcription"})`). API
    keys are checked before the upgrade, as for every /v1 route (auth.APIKeyMiddleware): in the Authorization
    header, or from a browser as the subprotocol `openai-insecure-api-key.<key>`."""
    app = websocket.app
    settings, load = app.state.settings, app.state.realtime
    # a browser offers `realtime` (and its key as another subprotocol): the handshake must select one it offered
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    await websocket.accept(subprotocol=REALTIME_SUBPROTOCOL if REALTIME_SUBPROTOCOL in offered else None)
    refusal = None
    if websocket.query_params.get("intent") != "transcription":
        refusal = error(
            "this server serves realtime transcription sessions only: connect to /v1/realtime?intent=transcription",
            code="unsupported_intent", param="intent",
        )  # fmt: skip
    elif app.state.models.default.state in ("loading", "down") or app.state.drain.draining:
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
    _open_session(app)
    await _serve(app, WebSocketTransport(websocket), session)


def _open_session(app) -> None:
    app.state.realtime.sessions += 1
    app.state.metrics.realtime_sessions.inc()


async def _serve(app, transport: Transport, session: dict | None) -> None:
    """A session opened by _open_session, until its client goes."""
    state = app.state
    try:
        connection = Connection(transport, state.models, state.settings, state.speech, state.metrics, state.realtime,
                                session)  # fmt: skip
        await connection.run()
    finally:
        state.realtime.sessions -= 1
        state.metrics.realtime_sessions.dec()


@router.post("/v1/realtime/calls", status_code=201)
async def create_call(request: Request) -> Response:
    """A WebRTC call (OpenAI's GA signalling): the client's SDP offer in, the answer out (201, `application/sdp`,
    `Location: /v1/realtime/calls/{call_id}`). The body is the offer itself (`Content-Type: application/sdp`, with
    a client secret or the API key), or a form with `sdp` and an optional `session` (JSON: the transcription
    session the call starts with; the SDK's `realtime.calls.create`). server/realtime/webrtc.py says what a call
    must offer."""
    app = request.app
    settings, load = app.state.settings, app.state.realtime
    offer, session = await _read_offer(request)
    config = SessionConfig(settings)
    secret = request.scope.get(SECRET_SCOPE_KEY)  # redeemed by the key check (auth.APIKeyMiddleware)
    try:
        for given in (secret.session if secret is not None else None, session):
            if given is not None:
                config.update(given)
    except SessionError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code) from None
    if app.state.models.default.state in ("loading", "down") or app.state.drain.draining:
        raise APIError(503, "The server is not ready to transcribe.", type="server_error", code="server_not_ready")
    if load.sessions >= settings.realtime_max_sessions:
        raise APIError(429, f"Too many realtime sessions (at most {settings.realtime_max_sessions}).",
                       code="session_limit_reached")  # fmt: skip
    call = Call(new_id("rtc"), load, ice_servers(settings.realtime_ice_servers),
                settings.realtime_webrtc_connect_timeout_s)  # fmt: skip
    try:
        answer = await call.answer(offer)
    except OfferError as exc:
        raise APIError(400, str(exc), param="sdp", code="invalid_offer") from None
    _open_session(app)
    app.state.calls.start(call, _serve(app, call, config.body()))
    return Response(answer, status_code=201, media_type="application/sdp",
                    headers={"Location": f"/v1/realtime/calls/{call.id}"})  # fmt: skip


@router.post("/v1/realtime/calls/{call_id}/hangup")
async def hangup_call(call_id: str, request: Request) -> Response:
    """End a WebRTC call this server answered (the SDK's `realtime.calls.hangup`)."""
    if not await request.app.state.calls.hangup(call_id):
        raise APIError(404, f"No call found with id '{call_id}'.", param="call_id", code="call_not_found")
    return Response(status_code=200)


async def _read_offer(request: Request) -> tuple[str, dict | None]:
    """The SDP offer and the optional session of a POST /v1/realtime/calls body, each bounded."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    limit = MAX_OFFER_BODY_BYTES
    try:
        limited = limited_request(request, limit, limit)
        if content_type == "application/sdp":
            return _text(await limited.body(), "sdp"), None
        if content_type != "multipart/form-data":
            raise APIError(400, f"Content-Type must be application/sdp or multipart/form-data, got "
                           f"'{content_type or 'none'}'.", code="invalid_content_type")  # fmt: skip
        try:
            form = await limited.form(max_files=2, max_fields=4, max_part_size=limit)
        except StarletteHTTPException as exc:
            raise APIError(400, f"Could not parse the multipart form: {exc.detail}") from exc
        parts = {}
        for name in ("sdp", "session"):
            part = form.get(name)
            if isinstance(part, UploadFile):  # a part sent with a filename
                part = _text(await part.read(), name)
            parts[name] = part
    except APIError as exc:
        if exc.status_code != 413:
            raise
        raise APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large") from exc
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc
    if not parts["sdp"]:
        raise APIError(400, "Missing required parameter: 'sdp'.", param="sdp", code="missing_required_parameter")
    session = parts["session"]
    if session is not None:
        session = parse_json(session, "The session")
        if not isinstance(session, dict):
            raise APIError(400, "session must be a JSON object.", param="session", code="invalid_type")
    return parts["sdp"], session


def _text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, f"{param} must be UTF-8 text.", param=param, code="invalid_value") from None


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
