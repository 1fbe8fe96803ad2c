"""Chat completions' answer: the transcript through the chat template, cut at `max_tokens`, whole or as a
stream of `chat.completion.chunk` events (what the SDK's `stream=True` reads)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta

from engine import EngineError, RequestHandle, Segment, Task, TranscriptionResult

from .chat_templates import ChatTemplate
from .drain import Drain
from .protocol import ChatCompletion, ChatCompletionMessage, Choice, CompletionUsage
from .streaming import engine_error, sse_event

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Answer:
    """What the template renders, for the audio's task and the request's text around it."""

    template: ChatTemplate
    task: Task
    instruction: str
    model: str
    duration: float  # of the audio, known before its transcript
    id: str = dataclasses.field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def content(self, segments: list[Segment], language: str) -> str:
        text = "".join(s.text for s in segments)
        return self.template.render(TranscriptionResult(text, segments, language, self.duration), self.task,
                                    self.instruction)  # fmt: skip

    def completion(self, result: TranscriptionResult, limit: int | None) -> ChatCompletion:
        segments, cut = truncate(result.segments, limit)
        return ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=[
                Choice(
                    index=0,
                    finish_reason="length" if cut else "stop",
                    message=ChatCompletionMessage(role="assistant", content=self.content(segments, result.language)),
                )
            ],
            usage=usage(segments),
        )

    def chunk(self, delta: ChoiceDelta | None, finish: str | None = None, usage: CompletionUsage | None = None) -> str:
        choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish)]
        return sse_event(ChatCompletionChunk(id=self.id, object="chat.completion.chunk", created=self.created,
                                             model=self.model, choices=choices, usage=usage))  # fmt: skip


def truncate(segments: list[Segment], limit: int | None) -> tuple[list[Segment], bool]:
    """The segments of the first `limit` text tokens (the last one cut), and whether anything was cut. Needs the
    segments' logprobs (DecodeOptions.logprobs), which carry each text token's bytes."""
    if limit is None:
        return segments, False
    kept, count = [], 0
    for segment in segments:
        tokens = segment.logprobs or []
        if count + len(tokens) <= limit:
            kept.append(segment)
            count += len(tokens)
            continue
        part = tokens[: limit - count]
        text = b"".join(t.bytes for t in part).decode("utf-8", "ignore")  # a character cut in two is dropped
        if text.strip():
            kept.append(dataclasses.replace(segment, text=text, logprobs=part))
        return kept, True
    return kept, False


def usage(segments: list[Segment]) -> CompletionUsage:
    tokens = sum(len(s.logprobs) if s.logprobs is not None else len(s.tokens) for s in segments)
    return CompletionUsage(prompt_tokens=0, completion_tokens=tokens, total_tokens=tokens)


async def completion_chunks(
    answer: Answer,
    handle: RequestHandle,
    limit: int | None,
    include_usage: bool,
    on_done: Callable[[TranscriptionResult], None],
    drain: Drain,
) -> AsyncIterator[str]:
    """The first chunk names the role; content deltas follow as windows finish (when the template renders in
    order: ChatTemplate.incremental; else the whole answer at the end); then finish_reason, usage if asked, and
    [DONE]. Reaching `limit` ends the request's decoding there. The deltas joined are the non-streamed answer."""
    finished = False
    sent, segments, cut, language = "", [], False, "en"
    try:
        yield answer.chunk(ChoiceDelta(role="assistant", content=""))
        try:
            async for event in handle.events():
                segments, cut = truncate(segments + event.segments, limit)
                if answer.template.incremental:
                    content = answer.content(segments, language)
                    if content.startswith(sent) and len(content) > len(sent):
                        yield answer.chunk(ChoiceDelta(content=content[len(sent) :]))
                        sent = content
                if cut:
                    handle.abort()  # the rest of the audio would be decoded for nobody
                    break
            if not cut:
                result = await handle.result()
                segments, language = result.segments, result.language
                on_done(result)
        except EngineError as exc:
            finished = True
            yield sse_event(engine_error(exc, drain).body())
            return
        finished = True
        content = answer.content(segments, language)
        if not content.startswith(sent):  # a template that ChatTemplate's check misjudged
            log.warning("the chat template's streamed answer does not begin the final one")
        elif len(content) > len(sent):
            yield answer.chunk(ChoiceDelta(content=content[len(sent) :]))
        yield answer.chunk(ChoiceDelta(), "length" if cut else "stop")
        if include_usage:
            yield answer.chunk(None, usage=usage(segments))
        yield "data: [DONE]\n\n"
    finally:
        drain.untrack(handle)
        if not finished:
            handle.abort()
