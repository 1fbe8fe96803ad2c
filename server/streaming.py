"""Waiting on the engine while watching the client: a disconnect aborts the request's decoding."""

from __future__ import annotations

import asyncio

import numpy as np
from starlette.requests import Request
from starlette.types import Receive

from engine.engine import Engine
from engine.request import DecodeOptions, EngineError, TranscriptionResult

from .errors import ClientDisconnectedError, from_engine_error


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone away (call only after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def transcribe(
    engine: Engine, audio: np.ndarray, options: DecodeOptions, request: Request
) -> TranscriptionResult:
    """Submit to the engine and wait for the whole result; abort it if the client disconnects first."""
    try:
        handle = engine.submit(audio, options)
    except EngineError as exc:
        raise from_engine_error(exc) from exc
    result_task = asyncio.ensure_future(handle.result())
    disconnect_task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    finished = False
    try:
        await asyncio.wait({result_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
        finished = result_task.done()
    finally:
        # Also reached when this handler is cancelled: never leave a slot decoding for nobody.
        disconnect_task.cancel()
        if not finished:
            handle.abort()
            result_task.cancel()
    if not finished:
        raise ClientDisconnectedError()
    try:
        return result_task.result()
    except EngineError as exc:
        raise from_engine_error(exc) from exc
