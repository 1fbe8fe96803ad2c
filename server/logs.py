"""Request ids (`x-request-id`, echoed and written in that request's log lines) and the log format (text or JSON)."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
# A client's id is reused only when it is short and printable: it goes into log lines and a response header.
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

# Credentials a client may put in a URL's query (a browser WebSocket cannot set headers): never logged.
_SECRET_QUERY = re.compile(r"(?i)([?&](?:api[_-]?key|access_token|token)=)[^&\s\"]*")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class RequestIdMiddleware:
    """Takes the client's `x-request-id` (or makes one), exposes it to the logs of this request, echoes it.

    An exception no handler turned into an answer is logged here, with the id, and answered with OpenAI's 500
    envelope (never a traceback), so that it too carries the id.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        rid = given if _CLIENT_ID.fullmatch(given) else uuid.uuid4().hex
        token = request_id.set(rid)

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = rid
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error on %s %s", scope.get("method", "WEBSOCKET"), scope["path"])
            if started or scope["type"] != "http":
                raise
            internal = APIError(500, "The server had an error while processing your request.")
            await internal.response()(scope, receive, send_with_id)
        finally:
            request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record: the id of the request whose code logged it, or '-'."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class RedactFilter(logging.Filter):
    """Replaces the value of `api_key=` (and `access_token=`, `token=`) in a URL's query with `***`, in every record:
    uvicorn's access lines carry the path with its query."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "=" in record.msg:
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple) and any(isinstance(arg, str) and "=" in arg for arg in record.args):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


def redact(text: str) -> str:
    return _SECRET_QUERY.sub(r"\1***", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, request id, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def log_config(level: str, fmt: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the server and uvicorn (its access lines carry the request id too)."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    handler = {"class": "logging.StreamHandler", "formatter": "default", "filters": ["request_id", "redact"]}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}, "redact": {"()": RedactFilter}},
        "formatters": {"default": formatter},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {
            name: {"handlers": [], "level": level.upper(), "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
