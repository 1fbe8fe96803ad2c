"""RequestTable: the loop's requests from arrival until their last event.

A request arrives with its samples; its log-mel comes from the feature worker (a GPU) or is computed here a piece
at a time between steps (a CPU); then its transcription (sequential, or chunked at VAD spans) queues its first
windows. Each finished window goes back to its transcription, which queues the next window or a retry, or emits
the result.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable

import numpy as np
import torch

from engine.audio.constants import CHUNK_LENGTH, SAMPLE_RATE
from engine.audio.feature_worker import features_ready
from engine.audio.features import LogMelBuilder
from engine.frontend import RequestHandle
from engine.messages import AddRequest
from engine.request import DecodeOptions, EngineDeadError, EngineError, EngineInternalError, RequestAbortedError
from engine.runtime.model_runner import ModelRunner
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence, WindowJob
from engine.transcription.chunked import ChunkedTranscription
from engine.transcription.sequential import Transcription
from engine.transcription.vad import VoiceActivityDetector

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class PendingFeatures:
    """A request whose log-mel the loop computes piece by piece between steps (no feature worker)."""

    handle: RequestHandle
    audio: np.ndarray
    options: DecodeOptions
    builder: LogMelBuilder


class RequestTable:
    """Owned by the loop thread. `mark_started(request_id)`: the request no longer waits (backpressure)."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, mark_started: Callable[[str], None]):
        self.runner = runner
        self.scheduler = scheduler
        self.mark_started = mark_started
        self.transcriptions: dict[str, tuple[Transcription, RequestHandle]] = {}
        self.features_pending: deque[PendingFeatures] = deque()  # log-mels being computed here, in turn
        self.vad = VoiceActivityDetector()  # chunked mode's; loads its model on first use

    def add(self, msg: AddRequest) -> None:
        """A new request: its log-mel came from the feature worker (GPU), or is computed here piece by piece."""
        if msg.features is None:
            builder = self.runner.log_mel_builder(torch.from_numpy(msg.audio))
            self.features_pending.append(PendingFeatures(msg.handle, msg.audio, msg.options, builder))
        elif isinstance(msg.features, Exception):
            self._failed_before_decoding(msg.handle, msg.features)
        else:
            self._start(msg.handle, msg.audio, msg.options, features_ready(msg.features))

    def advance_features(self) -> None:
        """One piece of the log-mel of the request first in line, which then goes to the back of the line: a
        request arriving beside hours of audio waits for one piece (30 s of audio) per request ahead of it, not
        for a whole-file STFT, and no more than one piece's intermediates are held."""
        pending = self.features_pending.popleft()
        try:
            done = pending.builder.step()
        except Exception as exc:  # e.g. out of memory: that request fails, the loop goes on
            self._failed_before_decoding(pending.handle, exc)
            return
        if done:
            self._start(pending.handle, pending.audio, pending.options, pending.builder.result())
        else:
            self.features_pending.append(pending)

    def _start(self, handle: RequestHandle, audio: np.ndarray, options: DecodeOptions, mel: torch.Tensor) -> None:
        """The request's transcription, its first windows queued for slots."""
        runner = self.runner
        try:
            args = (handle.request_id, mel, len(audio) / SAMPLE_RATE, options, runner.tokenizer, runner.n_text_ctx)
            if options.chunking is None:
                t = Transcription(*args, handle.emit)
            else:
                spans = self.vad.speech_spans(audio, options.chunking, max_span_s=CHUNK_LENGTH)
                t = ChunkedTranscription(*args, handle.emit, spans)
        except Exception as exc:
            self._failed_before_decoding(handle, exc)
            return
        t.submitted_at = handle.submitted_at
        jobs = t.start_jobs()
        if not jobs:  # empty audio: nothing to decode
            self.mark_started(handle.request_id)
            t.finish()
            return
        self.transcriptions[handle.request_id] = (t, handle)
        for job in jobs:
            self.scheduler.add(job, continuing=False)

    def uses_adapter(self, name: str) -> bool:
        """Whether a request in the table decodes with that LoRA adapter."""
        return any(p.options.adapter == name for p in self.features_pending) or any(
            t.options.adapter == name for t, _ in self.transcriptions.values()
        )

    def refuse(self, handle: RequestHandle, exc: EngineError) -> None:
        """A request refused as it reaches the loop: it ends with `exc`, never having waited for a slot."""
        self._failed_before_decoding(handle, exc)

    def _failed_before_decoding(self, handle: RequestHandle, exc: Exception) -> None:
        self.mark_started(handle.request_id)
        if not isinstance(exc, EngineError):
            log.error("request %s failed before decoding: %r", handle.request_id, exc)
            exc = EngineInternalError("preparing the audio failed")
        handle.emit(exc)

    def first_output(self, request_id: str, now: float) -> None:
        """A window of the request gave its first output (the request's time to first token, if it is the first)."""
        entry = self.transcriptions.get(request_id)
        if entry is not None and entry[0].first_token_at is None:
            entry[0].first_token_at = now

    def to_align(self, seq: Sequence) -> tuple[list[int], str, str]:
        """A finished window's text tokens whose words get timestamps, its language and its task."""
        t = self.transcriptions[seq.job.request_id][0]
        return t.tokens_to_align(seq), seq.language or t.language or "en", t.task.value

    def window_done(self, seq: Sequence) -> list[WindowJob]:
        """A finished window back to its transcription: the next windows or retries to queue, or none (the request
        is done, or failed: a bug in one request's bookkeeping must not take down the others)."""
        request_id = seq.job.request_id
        entry = self.transcriptions.get(request_id)
        if entry is None:  # ended since (aborted, failed): its windows were dropped
            return []
        t, handle = entry
        try:
            jobs = t.on_window_done(seq)
        except Exception as exc:
            if not isinstance(exc, EngineError):
                log.exception("request %s failed", request_id)
                exc = EngineInternalError("finishing a window failed")
            self._end(request_id, exc)
            return []
        if not jobs and t.done:
            self.transcriptions.pop(request_id, None)
        return jobs

    def _end(self, request_id: str, error: EngineError) -> None:
        """The request ends early with `error`: its transcription stops, its windows leave the scheduler."""
        entry = self.transcriptions.pop(request_id, None)
        if entry is not None:
            entry[0].aborted = True
            self.scheduler.drop(request_id)
            entry[1].emit(error)

    def abort(self, request_id: str) -> None:
        for pending in self.features_pending:
            if pending.handle.request_id == request_id:
                self.features_pending.remove(pending)
                self.mark_started(request_id)
                pending.handle.emit(RequestAbortedError(f"request {request_id} was aborted"))
                return
        if request_id in self.transcriptions:
            self.mark_started(request_id)
            self._end(request_id, RequestAbortedError(f"request {request_id} was aborted"))

    def fail(self, request_id: str, error: EngineError) -> None:
        """A decoding request fails (its step failed); its windows are dropped."""
        self._end(request_id, error)

    def fail_all(self, exc: BaseException) -> None:
        """The loop died: every request it held learns why."""
        self.end_all(EngineDeadError(f"engine failed: {exc!r}"))

    def end_all(self, error: EngineError) -> None:
        """Every request held ends with `error` (the loop died, or was shut down)."""
        handles = [handle for _, handle in self.transcriptions.values()]
        handles += [pending.handle for pending in self.features_pending]
        for handle in handles:
            handle.emit(error)
        self.transcriptions.clear()
        self.features_pending.clear()
