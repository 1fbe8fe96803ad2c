"""Server events of the Realtime API as plain dicts, in the shapes of the SDK's models (tests parse them with
those models); each gets a fresh event_id."""

from __future__ import annotations

import itertools
import secrets

_counter = itertools.count()


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}{next(_counter):x}"


def event(type_: str, **fields) -> dict:
    return {"type": type_, "event_id": new_id("event"), **fields}


def error(message: str, *, type_: str = "invalid_request_error", code: str | None = None, param: str | None = None,
          event_id: str | None = None) -> dict:  # fmt: skip
    """OpenAI's `error` event: the connection stays open unless the server says otherwise."""
    return event("error", error={"type": type_, "code": code, "message": message, "param": param, "event_id": event_id})


def user_item(item_id: str, status: str, transcript: str | None = None) -> dict:
    """A committed turn as a conversation item: user audio, its transcript once known."""
    return {
        "id": item_id,
        "type": "message",
        "object": "realtime.item",
        "role": "user",
        "status": status,
        "content": [{"type": "input_audio", "transcript": transcript}],
    }
