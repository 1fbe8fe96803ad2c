"""APIError and the one place that turns every failure into OpenAI's error envelope."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine import (
    DecodeBudgetExceededError,
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestAbortedError,
)

logger = logging.getLogger(__name__)

# OpenAI's `type` for each status; the SDK picks its exception class from the status alone.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
}

# Not a real HTTP status: nginx's "client closed request", used only in logs and metrics.
CLIENT_CLOSED_REQUEST = 499


class APIError(Exception):
    """A failure with a status the client should see, e.g. `APIError(400, "bad language", param="language")`."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        default_type = "server_error" if status_code >= 500 else "invalid_request_error"
        self.type = type or ERROR_TYPES.get(status_code, default_type)
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


class ClientDisconnectedError(Exception):
    """The client went away before its answer was ready; nothing can be sent."""


def from_engine_error(exc: Exception) -> APIError:
    """Map an engine exception to the status the SDK expects."""
    if isinstance(exc, EngineOverloadedError):
        retry_after = str(max(1, math.ceil(exc.retry_after_s)))
        return APIError(
            429,
            f"The server is overloaded: {exc}. Retry later.",
            code="server_overloaded",
            headers={"Retry-After": retry_after},
        )
    if isinstance(exc, DecodeBudgetExceededError):
        return APIError(400, str(exc), param=exc.param, code="decode_budget_exceeded")
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, (EngineDeadError, RequestAbortedError)):
        # the reason (an exit code, an exception) is in the server's log; the client learns only what to do
        return APIError(
            503, "The engine stopped while serving this request; retry it.", code="engine_unavailable",
            headers={"Retry-After": "1"},
        )  # fmt: skip
    return APIError(500, "The server had an error while processing your request.")


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """First pydantic error as (message, param)."""
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    return f"Invalid value for '{param}': {first.get('msg', 'invalid')}" if param else first.get("msg", ""), param


async def _api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}"
    else:
        message = str(exc.detail)
    return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()


async def _validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(exc)
    return APIError(400, message, param=param, code="invalid_value").response()


async def _client_disconnected_handler(request: Request, exc: ClientDisconnectedError) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it; it shows in logs and metrics


async def _unhandled_error_handler(request: Request, exc: Exception) -> JSONResponse:
    # Starlette logs the traceback after this response; the server keeps serving.
    logger.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
    return APIError(500, "The server had an error while processing your request.").response()


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure through OpenAI's `{"error": {...}}` envelope."""
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(ClientDisconnectedError, _client_disconnected_handler)
    app.add_exception_handler(Exception, _unhandled_error_handler)
