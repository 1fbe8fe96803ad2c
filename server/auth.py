"""API keys: `Authorization: Bearer <key>` checked before a request's body is read, answered as OpenAI does; and the
realtime client secrets (`ek_...`, server/realtime/client_secrets.py) that open one realtime connection instead."""

from __future__ import annotations

import hmac
import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError
from .realtime.client_secrets import PREFIX as SECRET_PREFIX
from .realtime.client_secrets import ClientSecrets

API_PREFIX = "/v1"
# Open unless the operator asks otherwise: probes and scrapers rarely carry keys.
HEALTH_PATHS = ("/health", "/health/live")
METRICS_PATH = "/metrics"


def missing_key() -> APIError:
    return APIError(
        401,
        "You didn't provide an API key. You need to provide your API key in an Authorization header using "
        "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        type="invalid_request_error",
        headers={"WWW-Authenticate": "Bearer"},
    )


def invalid_key(key: str) -> APIError:
    # Like OpenAI, show only the key's ends so that a log of the answer does not leak it.
    shown = f"{key[:3]}{'*' * 4}{key[-4:]}" if len(key) > 12 else "*" * 4
    return APIError(
        401,
        f"Incorrect API key provided: {shown}.",
        type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def refused_secret() -> APIError:
    return APIError(
        401,
        "The client secret is unknown, expired or already used: mint a new one (POST /v1/realtime/client_secrets).",
        type="invalid_request_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


# What a client secret opens: a realtime connection, WebSocket or WebRTC call, and nothing else
SECRET_PATHS = {("websocket", "/v1/realtime"), ("http", "/v1/realtime/calls")}
# The scope key under which a redeemed ClientSecret reaches the route
SECRET_SCOPE_KEY = "realtime_client_secret"


class KeyChecker:
    """Constant-time comparison against every accepted key (the time taken says nothing about which is close)."""

    def __init__(self, keys: list[str]):
        self.keys = [key.encode() for key in keys]

    def accepts(self, key: str) -> bool:
        given = key.encode()
        found = False
        for accepted in self.keys:
            found |= hmac.compare_digest(given, accepted)
        return found


def bearer_key(headers: Headers) -> str | None:
    """The key of `Authorization: Bearer <key>`; None without the header or with another scheme."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


# Browsers cannot set headers on a WebSocket: OpenAI's clients there send the key as a subprotocol instead,
# `openai-insecure-api-key.<key>`, beside `realtime` (the one the server selects).
KEY_SUBPROTOCOL = "openai-insecure-api-key."
REALTIME_SUBPROTOCOL = "realtime"


def subprotocol_key(headers: Headers) -> str | None:
    """A browser WebSocket's key, from its offered subprotocols; None if it offers none."""
    for offered in headers.get("sec-websocket-protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(KEY_SUBPROTOCOL) and len(offered) > len(KEY_SUBPROTOCOL):
            return offered[len(KEY_SUBPROTOCOL) :]
    return None


class APIKeyMiddleware:
    """Refuses requests without an accepted key on protected paths: every /v1 route (HTTP and WebSocket), and
    /health or /metrics when configured; with no keys configured, every request passes. Runs before routing, so a
    refused upload is never read. A realtime connection may carry a client secret instead of a key (on any
    server): it is redeemed here, once, and handed to the route in the scope (SECRET_SCOPE_KEY); one that is
    unknown, expired or used is refused as a wrong key is."""

    def __init__(
        self, app: ASGIApp, keys: list[str], secrets: ClientSecrets, protect_health: bool, protect_metrics: bool
    ):
        self.app = app
        self.checker = KeyChecker(keys)
        self.secrets = secrets
        self.protected_paths = set()
        if protect_health:
            self.protected_paths.update(HEALTH_PATHS)
        if protect_metrics:
            self.protected_paths.add(METRICS_PATH)

    def protects(self, scope: Scope) -> bool:
        if scope["type"] not in ("http", "websocket"):
            return False
        if scope["type"] == "http" and scope["method"] == "OPTIONS":  # CORS preflights carry no credentials
            return False
        path = scope["path"]
        return path == API_PREFIX or path.startswith(API_PREFIX + "/") or path in self.protected_paths

    @staticmethod
    def opens_with_secret(scope: Scope) -> bool:
        if (scope["type"], scope["path"]) not in SECRET_PATHS:
            return False
        return scope["type"] == "websocket" or scope["method"] == "POST"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.protects(scope):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        key = bearer_key(headers)
        if key is None and scope["type"] == "websocket":
            key = subprotocol_key(headers)
        if key is not None and key.startswith(SECRET_PREFIX) and self.opens_with_secret(scope):
            secret = self.secrets.redeem(key)
            scope[SECRET_SCOPE_KEY] = secret
            error = refused_secret() if secret is None else None
        elif not self.checker.keys:
            error = None
        else:
            error = missing_key() if key is None else None if self.checker.accepts(key) else invalid_key(key)
        if error is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket" and "websocket.http.response" in scope.get("extensions", {}):
            # refuse the upgrade with OpenAI's 401 and error body, as the HTTP routes answer (ASGI's denial response)
            body = json.dumps(error.body()).encode()
            headers = [
                (b"content-type", b"application/json"),
                *((k.lower().encode(), v.encode()) for k, v in (error.headers or {}).items()),
            ]
            await send({"type": "websocket.http.response.start", "status": error.status_code, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        elif scope["type"] == "websocket":  # a server without the denial extension: a plain refusal
            await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
        else:
            await error.response()(scope, receive, send)
