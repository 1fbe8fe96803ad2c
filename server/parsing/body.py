"""Request bodies read within bounds: the size limit (from Content-Length, then while reading), multipart forms
with the SDK's bracketed fields flattened, JSON of bounded structure, and pydantic validation as OpenAI's 400s."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from ..errors import APIError, ClientDisconnectedError
from ..protocol import Upload
from ..settings import MIB

# room for the non-file fields and multipart framing: up to 4 known speakers' references of 10 s each, as data URLs
FORM_OVERHEAD_BYTES = 8 * MIB
JSON_OVERHEAD_BYTES = MIB  # room for a JSON body's text around its base64 audio
MAX_FIELD_BYTES = 2 * MIB  # one non-file field (a reference's data URL is the largest)
MAX_FORM_FILES = 4
MAX_FORM_FIELDS = 256
# A chat body's structure: a transcription request has a few messages of a few parts; far more is refused unread.
MAX_JSON_CONTAINERS = 4096
MAX_JSON_DEPTH = 32


def too_large(max_upload_bytes: int) -> APIError:
    return APIError(
        413, f"Maximum content size limit ({max_upload_bytes} bytes) exceeded.", param="file", code="request_too_large"
    )


class BodyLimiter:
    """ASGI `receive` wrapper that stops reading a body once it passes `max_body_bytes`."""

    def __init__(self, receive: Receive, max_body_bytes: int, max_upload_bytes: int):
        self.receive = receive
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.num_bytes = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.num_bytes += len(message.get("body", b""))
            if self.num_bytes > self.max_body_bytes:
                raise too_large(self.max_upload_bytes)
        return message


def limited_request(request: Request, max_body_bytes: int, max_upload_bytes: int) -> Request:
    """A view of `request` whose body may not pass `max_body_bytes`: checked from Content-Length, then while reading."""
    content_length = request.headers.get("content-length")
    if content_length is not None and content_length.isdigit() and int(content_length) > max_body_bytes:
        raise too_large(max_upload_bytes)
    return Request(request.scope, BodyLimiter(request.receive, max_body_bytes, max_upload_bytes))


async def read_form(request: Request, max_upload_bytes: int) -> FormData:
    """The multipart form of an upload of at most `max_upload_bytes` (plus room for the other fields)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        raise APIError(
            400,
            f"Content-Type must be multipart/form-data, got '{content_type or 'none'}'.",
            code="invalid_content_type",
        )
    max_body_bytes = max_upload_bytes + FORM_OVERHEAD_BYTES
    try:
        return await limited_request(request, max_body_bytes, max_upload_bytes).form(
            max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS, max_part_size=MAX_FIELD_BYTES
        )
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc
    except StarletteHTTPException as exc:  # malformed multipart
        raise APIError(400, f"Could not parse the multipart form: {exc.detail}") from exc


async def read_json(request: Request, max_upload_bytes: int) -> Any:
    """A JSON body carrying base64 audio of at most `max_upload_bytes`, of bounded structure."""
    max_body_bytes = max_upload_bytes * 4 // 3 + JSON_OVERHEAD_BYTES  # base64 inflates by 4/3
    try:
        body = await limited_request(request, max_body_bytes, max_upload_bytes).body()
    except ClientDisconnect as exc:
        raise ClientDisconnectedError() from exc
    return parse_json(body)


def parse_json(body: bytes | str, what: str = "The request body") -> Any:
    """JSON of bounded structure (a request body, a realtime event), or an APIError that says what is wrong.

    Containers are counted before parsing: json.loads and validation hold the GIL (and so the event loop) for as
    long as a body has objects, a million tiny messages for seconds; base64 audio has no brackets, so a real body
    has few."""
    brace, bracket = (b"{", b"[") if isinstance(body, bytes) else ("{", "[")
    if body.count(brace) + body.count(bracket) > MAX_JSON_CONTAINERS:
        raise APIError(
            400, f"{what} has too many JSON objects and arrays (more than {MAX_JSON_CONTAINERS}).", code="invalid_value"
        )
    try:
        value = json.loads(body)
        too_deep = json_depth(value) > MAX_JSON_DEPTH
    except RecursionError:
        too_deep = True
    except ValueError as exc:  # JSONDecodeError, undecodable bytes, an integer of thousands of digits
        raise APIError(400, f"{what} is not valid JSON: {exc}", code="invalid_value") from None
    if too_deep:  # (the error made only then: a realtime session parses ten events a second)
        raise APIError(400, f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels.", code="invalid_value")
    return value


def json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion (a body has at most MAX_JSON_CONTAINERS containers)."""
    depth, level = 0, [(value, 1)]
    while level:
        item, d = level.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        depth = max(depth, d)
        level.extend((child, d + 1) for child in item if isinstance(child, (dict, list)))
    return depth


def form_fields(form: FormData) -> dict[str, Any]:
    """Flatten the SDK's encoding: `a[]` repeated → list, `a[k]=v` → dict, `a=v` → str (last wins)."""
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            value = "<file>"  # only `file` may be one; parse_upload reports it by name
        if key.endswith("[]"):
            fields.setdefault(key, []).append(value)
        elif key.endswith("]") and "[" in key:
            base, sub = key[:-1].split("[", 1)
            nested = fields.get(base)
            fields[base] = nested = nested if isinstance(nested, dict) else {}
            nested[sub] = value
        elif key != "file":
            fields[key] = value
    return fields


def known_fields(model_cls: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model_cls.model_fields.items()}


def validate_model(model_cls: type[BaseModel], fields: dict[str, Any]) -> Any:
    """Validate with pydantic; the first error becomes a 400 naming the wire field."""
    try:
        return model_cls.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "missing":
            raise APIError(
                400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
            ) from None
        raise APIError(
            400, f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value"
        ) from None


async def parse_upload(form: FormData, max_bytes: int) -> Upload:
    value = form.get("file")
    if value is None:
        raise APIError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
    if not isinstance(value, UploadFile):
        raise APIError(
            400,
            "'file' must be an uploaded file (multipart file part), not a text field.",
            param="file",
            code="invalid_value",
        )
    data = await value.read()
    if len(data) > max_bytes:
        raise too_large(max_bytes)
    if not data:
        raise APIError(400, "The audio file is empty.", param="file", code="invalid_value")
    return Upload(data=data, filename=value.filename, content_type=value.content_type)
