"""Waiting on the engine while watching the client (a disconnect aborts the request's decoding), and
OpenAI's transcription stream: server-sent `transcript.text.delta` events as windows finish, then `.done`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import numpy as np
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent, TranscriptionTextSegmentEvent
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive

from engine import (
    DecodeOptions,
    Diarization,
    EngineError,
    EngineLike,
    RequestHandle,
    Segment,
    TranscriptionResult,
    diarized_segments,
)

from .drain import Drain, shutting_down
from .errors import APIError, ClientDisconnectedError, from_engine_error
from .formatting import LogprobStream, SpeakerLetters, token_logprobs, token_usage
from .protocol import Logprob


class TextDelta(TranscriptionTextDeltaEvent):
    logprobs: list[Logprob] | None = None  # bytes as integers, as OpenAI sends them


class TextDone(TranscriptionTextDoneEvent):
    logprobs: list[Logprob] | None = None


SSE_MEDIA_TYPE = "text/event-stream"
# No caching, and no buffering in a reverse proxy (nginx honours X-Accel-Buffering), so each event goes out at once.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client has gone away (call only after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def submit(engine: EngineLike, audio: np.ndarray, options: DecodeOptions, drain: Drain) -> RequestHandle:
    """Queue a request; a full queue, a bad option or a dead engine is an APIError before any response starts."""
    if drain.draining:
        raise shutting_down()
    try:
        return drain.track(engine.submit(audio, options))
    except EngineError as exc:
        raise from_engine_error(exc) from exc


def engine_error(exc: EngineError, drain: Drain) -> APIError:
    """A request's failure as the client sees it; one aborted by the drain timeout says the server is stopping."""
    return shutting_down() if drain.expired else from_engine_error(exc)


async def wait_result(handle: RequestHandle, request: Request, drain: Drain) -> TranscriptionResult:
    """A submitted request's whole result; aborted if the client disconnects first (submit, then wait with this,
    so that the caller can let go of the samples meanwhile: hours of audio are hundreds of MB)."""
    result_task = asyncio.ensure_future(handle.result())
    disconnect_task = asyncio.ensure_future(wait_for_disconnect(request.receive))
    finished = False
    try:
        await asyncio.wait({result_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
        finished = result_task.done()
    finally:
        # Also reached when this handler is cancelled: never leave a slot decoding for nobody.
        disconnect_task.cancel()
        drain.untrack(handle)
        if not finished:
            handle.abort()
            result_task.cancel()
    if not finished:
        raise ClientDisconnectedError()
    try:
        return result_task.result()
    except EngineError as exc:
        raise engine_error(exc, drain) from exc


def sse_event(data: BaseModel | dict) -> str:
    body = data.model_dump_json(exclude_none=True) if isinstance(data, BaseModel) else json.dumps(data)
    return f"data: {body}\n\n"


class DeltaText:
    """Turns segment texts into deltas whose concatenation is exactly the final, stripped transcript."""

    def __init__(self) -> None:
        self.sent = ""  # text of the deltas so far
        self.held = ""  # trailing whitespace, sent only once more text follows it

    def add(self, text: str) -> str:
        text = self.held + text
        if not self.sent:
            text = text.lstrip()  # the transcript is stripped, so the first delta starts at its first word
        delta = text.rstrip()
        self.held = text[len(delta) :]
        self.sent += delta
        return delta


async def transcript_events(
    handle: RequestHandle, on_done: Callable[[TranscriptionResult], None], drain: Drain, logprobs: bool = False
) -> AsyncIterator[str]:
    """OpenAI's transcription stream: a delta for each window's final segments, then the whole text and usage;
    with `logprobs`, each event carries its tokens' log-probabilities.

    Dropping the stream (the client went away) aborts the request. A failure after the response has started is
    sent as an `{"error": ...}` event, which the SDK raises as an APIError.
    """
    finished = False
    try:
        deltas = DeltaText()
        tokens = LogprobStream()
        try:
            async for event in handle.events():
                if logprobs:
                    tokens.add(event.segments)
                start = len(deltas.sent)
                delta = deltas.add("".join(segment.text for segment in event.segments))
                if delta:
                    items = tokens.take(start, len(deltas.sent)) if logprobs else None
                    yield sse_event(TextDelta(type="transcript.text.delta", delta=delta, logprobs=items))
            result = await handle.result()
        except EngineError as exc:
            finished = True
            yield sse_event(engine_error(exc, drain).body())
            return
        finished = True
        done = TextDone(
            type="transcript.text.done",
            text=result.text.strip(),
            usage=token_usage(result),
            logprobs=token_logprobs(result.segments) if logprobs else None,
        )
        yield sse_event(done)
        on_done(result)
    finally:
        drain.untrack(handle)
        if not finished:  # cancelled mid-stream: never leave a slot decoding for nobody
            handle.abort()


async def diarized_events(
    handle: RequestHandle, turns: asyncio.Task[Diarization], on_done: Callable[[TranscriptionResult], None],
    drain: Drain,
) -> AsyncIterator[str]:
    """OpenAI's diarized stream: a `transcript.text.segment` event for each speaker's segment as it becomes final,
    then `transcript.text.done`. A window's segments are final when the engine has decoded them and the speaker
    turns of the recording are known (computed beside the decoding, usually before the first windows end);
    until then they wait. Failures and a client gone away as in transcript_events."""
    finished = False
    letters: SpeakerLetters | None = None
    pending: list[Segment] = []
    sent = 0

    def segment_events(speakers: Diarization) -> list[str]:
        nonlocal sent, letters
        letters = letters or SpeakerLetters(speakers.names)
        events = []
        for s in diarized_segments(pending, speakers.turns):
            event = TranscriptionTextSegmentEvent(
                type="transcript.text.segment", id=f"seg_{sent}", start=round(s.start, 3), end=round(s.end, 3),
                text=s.text, speaker=letters.of(s.speaker),
            )  # fmt: skip
            events.append(sse_event(event))
            sent += 1
        pending.clear()
        return events

    try:
        try:
            async for event in handle.events():
                pending.extend(event.segments)
                if turns.done():
                    for item in segment_events(turns.result()):
                        yield item
            result = await handle.result()
            for item in segment_events(await turns):
                yield item
        except (EngineError, APIError) as exc:
            finished = True
            yield sse_event((engine_error(exc, drain) if isinstance(exc, EngineError) else exc).body())
            return
        finished = True
        yield sse_event(TextDone(type="transcript.text.done", text=result.text.strip(), usage=token_usage(result)))
        on_done(result)
    finally:
        drain.untrack(handle)
        if not finished:
            handle.abort()
            turns.cancel()


def sse_response(handle: RequestHandle, events: AsyncIterator[str], drain: Drain) -> StreamingResponse:
    # The cleanup after the response also covers a client gone before the stream's first event (the generator's
    # own never runs then); once the result is in, abort does nothing.
    def cleanup() -> None:
        drain.untrack(handle)
        handle.abort()

    return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS, background=BackgroundTask(cleanup))
