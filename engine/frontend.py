"""What callers hold: the EngineLike protocol that Engine, EngineProcess and test fakes implement, the request
handle, and the checks both engines make in the caller's thread before a request is queued."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import time
from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import numpy as np

from engine.config import EngineConfig
from engine.model.tokenizer import Tokenizer
from engine.request import (
    DecodeOptions,
    EngineStats,
    InvalidRequestError,
    SegmentEvent,
    Task,
    TranscriptionResult,
)
from engine.transcription.sequential import prompt_tokens


@runtime_checkable
class Handle(Protocol):
    """One submitted request, as its caller sees it."""

    request_id: str

    def events(self) -> AsyncIterator[SegmentEvent]: ...

    async def result(self) -> TranscriptionResult: ...

    def abort(self) -> None: ...


@runtime_checkable
class EngineLike(Protocol):
    """What the server needs of an engine: Engine (a loop thread in this process), EngineProcess (a child process)
    and the tests' fake all answer it."""

    model_name: str
    is_multilingual: bool

    @property
    def is_alive(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    def start(self) -> None: ...

    def submit(self, audio: np.ndarray, options: DecodeOptions) -> Handle:
        """Queue a request; raises InvalidRequestError, EngineOverloadedError or EngineDeadError."""
        ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    def change_adapter(self, name: str, folder: str | None) -> None: ...

    def shutdown(self) -> None: ...


def check_audio(audio: np.ndarray) -> np.ndarray:
    """Samples as the engine takes them: 1-D, floating point, finite; InvalidRequestError otherwise."""
    audio = np.asarray(audio)
    if audio.ndim != 1 or audio.dtype.kind != "f":
        raise InvalidRequestError(f"audio must be 1-D float samples, got {audio.dtype} of shape {audio.shape}")
    if not np.isfinite(audio).all():
        raise InvalidRequestError("audio contains NaN or infinite samples", "file")
    return audio


class EngineFront:
    """What Engine and EngineProcess answer alike, from the config and the tokenizer."""

    config: EngineConfig
    tokenizer: Tokenizer
    n_text_ctx: int  # the decoder's context (self-attention cache length), which bounds a prompt
    num_slots: int  # sequences decoded at once, which bounds a window's beams
    adapter_names: frozenset[str] = frozenset()  # the LoRA adapters resident (DecodeOptions.adapter)

    @property
    def model_name(self) -> str:
        return self.config.model

    @property
    def is_multilingual(self) -> bool:
        return self.tokenizer.is_multilingual

    def prepare(self, options: DecodeOptions) -> DecodeOptions:
        """The options as the loop takes them: checked, the prompt tokenized here (in the caller's thread) and cut
        to what can be context, the engine's decode budget and seed filled in; a fixed token count decodes
        greedily without quality fallbacks."""
        self.validate(options)
        changes: dict = {}
        if options.prompt_tokens is None and options.prompt:
            changes["prompt_tokens"] = tuple(prompt_tokens(self.tokenizer, options.prompt, self.n_text_ctx))
        if options.languages is not None:
            known = [c for c in options.languages if c in self.tokenizer.language_ids or c == "en"]
            if len(known) == 1 or not self.tokenizer.is_multilingual:  # one choice: nothing to detect
                changes.update(language=known[0] if self.tokenizer.is_multilingual else None, languages=None)
            else:
                changes["languages"] = tuple(known)
        if options.keywords and options.keyword_prompt is None and not options.keywords_in_prompt:
            changes["keyword_prompt"] = ()
        elif options.keywords and options.keyword_prompt is None:
            changes["keyword_prompt"] = self._bounded_tokens(", ".join(options.keywords), "keywords take", "keywords")
        if options.prefix is not None and options.prefix_tokens is None:
            changes["prefix_tokens"] = self._bounded_tokens(options.prefix.strip(), "the prefix takes", "prefix")
        if options.decode_budget_per_window is None:
            changes["decode_budget_per_window"] = self.config.decode_budget_per_window
        if options.seed is None:
            changes["seed"] = self.config.seed
        if options.fixes_tokens:
            changes.update(
                temperatures=(0.0,), no_speech_threshold=None, log_prob_threshold=None, compression_ratio_threshold=None
            )
        return dataclasses.replace(options, **changes) if changes else options

    def _bounded_tokens(self, text: str, what: str, param: str) -> tuple[int, ...]:
        """text's tokens (after a space, as Whisper encodes text it adds to a prompt), at most a quarter of the
        context: the prompt keeps its half, and the decode its room."""
        tokens = self.tokenizer.encode(" " + text)
        limit = self.n_text_ctx // 4
        if len(tokens) > limit:
            raise InvalidRequestError(f"{what} {len(tokens)} tokens; at most {limit} fit", param)
        return tuple(tokens)

    def validate(self, options: DecodeOptions) -> None:
        """What the model cannot do as asked (a language it lacks, translation on an English-only model)."""
        tok = self.tokenizer
        if options.language is not None:
            if not tok.is_multilingual and options.language != "en":
                raise InvalidRequestError(
                    f"This model is English-only; language {options.language!r} is not supported", "language"
                )
            if tok.is_multilingual and options.language not in tok.language_ids:
                raise InvalidRequestError(f"Unsupported language {options.language!r}", "language")
        if options.languages is not None:
            if not options.languages:
                raise InvalidRequestError("languages must not be empty", "languages")
            if options.language is not None:
                raise InvalidRequestError("Send either language or languages, not both", "languages")
            known = tok.language_ids if tok.is_multilingual else {"en": None}
            if not any(code in known for code in options.languages):
                raise InvalidRequestError(
                    f"None of the languages {list(options.languages)} is one this model "
                    f"{'knows' if tok.is_multilingual else 'speaks (it is English-only)'}",
                    "languages",
                )
        if options.beam_size > self.num_slots:
            raise InvalidRequestError(
                f"beam_size {options.beam_size} is more than the {self.num_slots} sequences this server decodes at once",
                "beam_size",
            )
        if options.adapter is not None and options.adapter not in self.adapter_names:
            raise InvalidRequestError(f"The adapter {options.adapter!r} is not loaded", "model")
        if options.task == Task.TRANSLATE and not tok.is_multilingual:
            raise InvalidRequestError("This model is English-only and cannot translate", "model")


class RequestHandle:
    """The caller's end of one request: async events/result, or a blocking wait (CLI)."""

    def __init__(self, engine: EngineLike, request_id: str):
        self.engine = engine
        self.request_id = request_id
        self.submitted_at = time.perf_counter()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            self._aqueue: asyncio.Queue = asyncio.Queue()
        except RuntimeError:
            self._loop = None
        self._squeue: queue.SimpleQueue = queue.SimpleQueue()
        self._result: TranscriptionResult | None = None

    def emit(self, item: object) -> None:
        """Called from the engine thread."""
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._aqueue.put_nowait, item)
            except RuntimeError:  # the caller's event loop is gone; nobody is listening
                self.engine.abort(self.request_id)
        else:
            self._squeue.put(item)

    def _unwrap(self, item: object) -> SegmentEvent | None:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, TranscriptionResult):
            self._result = item
            return None
        return item  # type: ignore[return-value]

    async def events(self) -> AsyncIterator[SegmentEvent]:
        """Yields SegmentEvent as windows finish; returns when the request is done."""
        while self._result is None:
            event = self._unwrap(await self._aqueue.get())
            if event is not None:
                yield event

    async def result(self) -> TranscriptionResult:
        async for _ in self.events():
            pass
        assert self._result is not None
        return self._result

    def wait(self, timeout: float | None = None) -> TranscriptionResult:
        while self._result is None:
            self._unwrap(self._squeue.get(timeout=timeout))
        return self._result

    def abort(self) -> None:
        if self._result is None:
            self.engine.abort(self.request_id)
