"""Engine: an inbox, one loop thread that schedules and steps, and per-request output handles."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections import deque

import numpy as np
import torch

from engine.audio import CHUNK_LENGTH
from engine.config import EngineConfig
from engine.feature_worker import FeatureWorker, features_ready
from engine.features import LogMelBuilder
from engine.longform.chunked_transcription import ChunkedTranscription
from engine.longform.transcription import Transcription, prompt_tokens
from engine.longform.vad import VoiceActivityDetector
from engine.model.tokenizer import Tokenizer
from engine.model_runner import ModelRunner, StepOutput
from engine.request import (
    DecodeOptions,
    EngineDeadError,
    EngineError,
    EngineInternalError,
    EngineOverloadedError,
    EngineStats,
    InvalidRequestError,
    RequestAbortedError,
    SegmentEvent,
    Task,
    TranscriptionResult,
)
from engine.scheduler import Scheduler
from engine.sequence import ON_DEVICE, Sequence

log = logging.getLogger(__name__)
_DONE = object()
# Short prompts ride along with the decode steps only while fewer sequences than this are running and no window
# is left waiting. With a few rows a step is short, so a prefill pass (~25 ms of eager launches on a GPU) would
# dominate; with many, or with a backlog, the pass is shared by a large admitted batch and admitting quickly in
# large encoder batches matters more. H200, large-v3, benchmarks/gpu_throughput.py --stepwise-prompt-tokens 8
# against 0: step-wise on whenever fewer than 64 ran gave +14% at 8 windows and +10% at 64 but -9% at a burst of
# 256 (1,833 vs 2,024 RTFx, p50 time to first token 1.41 vs 1.02 s: the burst was admitted in twice as many encoder
# batches). Holding partial encoder batches back for 5-25 ms did not restore it (60-66 batches either way).
STEPWISE_MAX_RUNNING = 64
# What a launched step's output is for one sequence: nothing (a forced prompt token was fed), the language pick,
# or a sampled token.
FORCED, DETECT, SAMPLE = 0, 1, 2


def check_audio(audio: np.ndarray) -> np.ndarray:
    """Samples as the engine takes them: 1-D, floating point, finite; InvalidRequestError otherwise."""
    audio = np.asarray(audio)
    if audio.ndim != 1 or audio.dtype.kind != "f":
        raise InvalidRequestError(f"audio must be 1-D float samples, got {audio.dtype} of shape {audio.shape}")
    if not np.isfinite(audio).all():
        raise InvalidRequestError("audio contains NaN or infinite samples", "file")
    return audio


@dataclasses.dataclass(slots=True)
class PendingFeatures:
    """A request whose log-mel the loop computes piece by piece between steps (no feature worker)."""

    handle: RequestHandle
    audio: np.ndarray
    options: DecodeOptions
    builder: LogMelBuilder


class EngineFront:
    """What Engine and engine/engine_process.py's EngineProcess answer alike, from the config and the tokenizer."""

    config: EngineConfig
    tokenizer: Tokenizer
    n_text_ctx: int  # the decoder's context (self-attention cache length), which bounds a prompt

    @property
    def model_name(self) -> str:
        return self.config.model

    @property
    def is_multilingual(self) -> bool:
        return self.tokenizer.is_multilingual

    def prepare(self, options: DecodeOptions) -> DecodeOptions:
        """The options as the loop takes them: checked, the prompt tokenized here (in the caller's thread) and cut
        to what can be context, the engine's decode budget filled in."""
        self.validate(options)
        changes: dict = {}
        if options.prompt_tokens is None and options.prompt:
            changes["prompt_tokens"] = tuple(prompt_tokens(self.tokenizer, options.prompt, self.n_text_ctx))
        if options.decode_budget_per_window is None:
            changes["decode_budget_per_window"] = self.config.decode_budget_per_window
        return dataclasses.replace(options, **changes) if changes else options

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
        if options.task == Task.TRANSLATE and not tok.is_multilingual:
            raise InvalidRequestError("This model is English-only and cannot translate", "model")


class RequestHandle:
    """The caller's end of one request: async events/result, or a blocking wait (CLI)."""

    def __init__(self, engine: Engine, request_id: str):
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

    async def events(self):
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


class Engine(EngineFront):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        # Submitted, first window not yet in a decode slot: in the inbox, computing features or waiting in the
        # scheduler. max_waiting bounds this set, so what queued requests hold (samples, log-mel) is bounded too.
        self._unstarted: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        # The loop thread also loads the model: a CPU's OpenMP thread team then belongs to the one thread
        # that computes (a second team, left by loading elsewhere, costs ~10% per token on 2 cores).
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="engine-loop", daemon=True)
        self._thread.start()
        self._loaded.wait()
        if self._error is not None:
            raise self._error
        self.tokenizer = self.runner.tokenizer
        self.n_text_ctx = self.runner.n_text_ctx
        # On a GPU new requests' log-mels are computed beside the loop; on a CPU the loop computes them itself,
        # so that one OpenMP thread team does all the work (a second team would compete for the cores).
        self._features = FeatureWorker(self.runner.log_mel, self.inbox.put) if self.runner.on_gpu else None
        stepwise = config.stepwise_prompt_tokens
        self.stepwise_prompt_tokens = stepwise if stepwise is not None else (8 if self.runner.on_gpu else 0)
        self.scheduler = Scheduler(self.runner.num_slots, self.runner.max_encoder_batch, self.runner.admissible_encoder_batch)
        # On a GPU step N+1 is launched before step N's tokens are read, so the host's work between steps (reading,
        # bookkeeping, the next step's inputs and rules) runs while the GPU computes instead of leaving it idle.
        # A CPU computes while the host works anyway: there each step is read right after it is launched.
        overlap = config.overlap_steps
        self.overlap_steps = self.runner.on_gpu if overlap is None else overlap
        self._in_flight: tuple[list[tuple[Sequence, int, int]], StepOutput] | None = None
        self._transcriptions: dict[str, tuple[Transcription, RequestHandle]] = {}
        self._features_pending: deque[PendingFeatures] = deque()  # log-mels being computed here, in turn
        self.vad = VoiceActivityDetector()  # chunked mode's; loads its model on first use
        self.num_steps = 0
        self.num_tokens = 0
        self.busy_seconds = 0.0  # time spent in step(): busy / wall time is how loaded the engine is

    # ---- public API (any thread) ------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        return self._started.is_set() and self._thread.is_alive() and self._error is None

    @property
    def failure(self) -> str | None:
        """Why the loop stopped, once it has."""
        return None if self._error is None else repr(self._error)

    def start(self) -> None:
        self._started.set()

    def shutdown(self) -> None:
        self._stopped.set()
        self._started.set()
        if self._features is not None:
            self._features.close()
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=len(self._unstarted),
            num_running=len(self.scheduler.running),
            num_slots=self.runner.num_slots,
            extra=self._totals(),
        )

    def _totals(self) -> dict[str, float]:
        totals = {"steps": float(self.num_steps), "tokens": float(self.num_tokens), "busy_seconds": self.busy_seconds}
        graphs = self.runner.graphs
        if graphs is not None:
            s = graphs.stats
            totals.update(
                encoder_graph_replays=s.encoder_replays, encoder_eager_runs=s.encoder_eager,
                decoder_graph_replays=s.decoder_replays, decoder_eager_runs=s.decoder_eager,
                prompt_graph_replays=s.prefill_replays, multi_step_graph_replays=s.multi_step_replays,
                encoder_padded_windows=s.encoder_padded_windows,
            )  # fmt: skip
        return totals

    def submit(self, audio: np.ndarray, options: DecodeOptions) -> RequestHandle:
        """Queue a request; raises InvalidRequestError, EngineOverloadedError or EngineDeadError."""
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        audio = check_audio(audio)
        return self.submit_checked(audio, self.prepare(options))

    def submit_checked(self, audio: np.ndarray, options: DecodeOptions, request_id: str | None = None) -> RequestHandle:
        """submit() for samples and options already checked and prepared: engine/engine_process.py's child, whose parent
        did both, so the scan of every sample is not repeated beside this engine's loop."""
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        if self.config.fixed_decode_tokens is not None:
            options = dataclasses.replace(
                options, fixed_decode_tokens=self.config.fixed_decode_tokens, temperatures=(0.0,),
                no_speech_threshold=None, log_prob_threshold=None, compression_ratio_threshold=None,
            )  # fmt: skip
        request_id = request_id or f"req-{next(self._ids)}"
        with self._lock:
            if len(self._unstarted) >= self.config.max_waiting:
                raise EngineOverloadedError(f"{len(self._unstarted)} requests are already waiting; retry later")
            self._unstarted.add(request_id)
        handle = self.make_handle(request_id)
        self._send(("add", handle, np.ascontiguousarray(audio, dtype=np.float32), options))
        return handle

    def make_handle(self, request_id: str) -> RequestHandle:
        """The handle a request's events go to (engine/engine_process.py's child forwards them to its parent instead)."""
        return RequestHandle(self, request_id)

    def on_started(self, request_id: str) -> None:
        """Called on the loop thread when a request no longer waits: its first window got a decode slot, or it
        ended before (failed, aborted, nothing to decode)."""

    def _mark_started(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._unstarted:
                return
            self._unstarted.discard(request_id)
        self.on_started(request_id)

    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def _send(self, msg: tuple) -> None:
        """Into the loop's inbox, through the feature worker when there is one (it keeps the order)."""
        (self._features.put if self._features is not None else self.inbox.put)(msg)

    def transcribe(self, audio: np.ndarray, options: DecodeOptions | None = None) -> TranscriptionResult:
        """Blocking convenience for scripts and the CLI."""
        self.start()
        return self.submit(audio, options or DecodeOptions()).wait()

    # ---- loop thread ------------------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            self.runner = ModelRunner(self.config)
        except BaseException as exc:  # raised to the caller of Engine()
            self._error = exc
            return
        finally:
            self._loaded.set()
        self._started.wait()
        if not self._stopped.is_set():
            self._run_forever()

    def _run_forever(self) -> None:
        torch.set_grad_enabled(False)
        try:
            while not self._stopped.is_set():
                self._drain_inbox(block=not self._has_work())
                start = time.perf_counter()
                if self._features_pending:
                    self._advance_features()
                if self.scheduler.has_work() or self._in_flight is not None:
                    try:
                        self.step()
                    except Exception as exc:  # fail the requests in this step, keep serving the others
                        self._fail_running(exc)
                self.busy_seconds += time.perf_counter() - start
        except BaseException as exc:  # a real fault: fail every request, keep the reason for /health
            log.exception("engine loop died")
            self._error = exc
            handles = [handle for _, handle in self._transcriptions.values()]
            handles += [pending.handle for pending in self._features_pending]
            for handle in handles:
                handle.emit(EngineDeadError(f"engine failed: {exc!r}"))
            self._transcriptions.clear()
            self._features_pending.clear()

    def _has_work(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None or bool(self._features_pending)

    def _advance_features(self) -> None:
        """One piece of the log-mel of the request first in line, which then goes to the back of the line: a
        request arriving beside hours of audio waits for one piece (30 s of audio) per request ahead of it, not
        for a whole-file STFT, and no more than one piece's intermediates are held."""
        pending = self._features_pending.popleft()
        try:
            done = pending.builder.step()
        except Exception as exc:  # e.g. out of memory: that request fails, the loop goes on
            self._failed_before_decoding(pending.handle, exc)
            return
        if done:
            self._start(pending.handle, pending.audio, pending.options, pending.builder.result())
        else:
            self._features_pending.append(pending)

    def _fail_running(self, exc: Exception) -> None:
        log.exception("engine step failed; failing the requests it was decoding")
        self._in_flight = None
        self.runner.reset_steps()
        for seq in self.scheduler.running:
            t = seq.job.transcription
            t.aborted = True
            entry = self._transcriptions.pop(t.request_id, None)
            if entry is not None:
                entry[1].emit(EngineInternalError("decoding failed"))
        self.scheduler.running = []
        self.scheduler.drop_aborted()

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if msg is None:
                return
            if msg[0] == "add":
                self._add(*msg[1:])
            elif msg[0] == "abort":
                self._abort(msg[1])

    def _add(self, handle: RequestHandle, audio: np.ndarray, options: DecodeOptions, prepared=None) -> None:
        """A new request: its log-mel came from the feature worker (GPU), or is computed here piece by piece."""
        if prepared is None:
            builder = self.runner.log_mel_builder(torch.from_numpy(audio))
            self._features_pending.append(PendingFeatures(handle, audio, options, builder))
        elif isinstance(prepared, Exception):
            self._failed_before_decoding(handle, prepared)
        else:
            self._start(handle, audio, options, features_ready(prepared))

    def _failed_before_decoding(self, handle: RequestHandle, exc: Exception) -> None:
        self._mark_started(handle.request_id)
        if not isinstance(exc, EngineError):
            log.error("request %s failed before decoding: %r", handle.request_id, exc)
            exc = EngineInternalError("preparing the audio failed")
        handle.emit(exc)

    def _start(self, handle: RequestHandle, audio: np.ndarray, options: DecodeOptions, mel: torch.Tensor) -> None:
        """The request's transcription, its first windows queued for slots."""
        try:
            args = (handle.request_id, mel, len(audio) / 16000, options, self.tokenizer, self.runner.n_text_ctx)
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
            self._mark_started(handle.request_id)
            t.finish()
            return
        self._transcriptions[handle.request_id] = (t, handle)
        for job in jobs:
            self.scheduler.add(job, continuing=False)

    def _abort(self, request_id: str) -> None:
        for pending in self._features_pending:
            if pending.handle.request_id == request_id:
                self._features_pending.remove(pending)
                self._mark_started(request_id)
                pending.handle.emit(RequestAbortedError(f"request {request_id} was aborted"))
                return
        entry = self._transcriptions.pop(request_id, None)
        if entry is None:
            return
        entry[0].aborted = True
        self._mark_started(request_id)
        entry[1].emit(RequestAbortedError(f"request {request_id} was aborted"))
        self.scheduler.drop_aborted()

    def step(self) -> None:
        """Admit waiting windows (encoder; a prefill pass for long prompts), then launch one decode step for every
        running sequence, and read the step before it (overlapped) or this one (not). Short prompts are fed by the
        decode steps themselves, one token per step (`stepwise_prompt_tokens`), unless nothing else is running and
        a graph replays their prompt pass."""
        sched, runner = self.scheduler, self.runner
        new = sched.admit()
        for seq in new:
            self._mark_started(seq.job.transcription.request_id)
        if new:
            runner.encode_into_slots([s.job.mel for s in new], new[0].slot)
            running_before = len(sched.running) - len(new)
            short = all(len(s.pending) <= self.stepwise_prompt_tokens for s in new)
            # With nothing else running (the new windows start at slot 0), a prompt pass replayed from a graph
            # (runner.prompt_graph_fits) is one pass where step-wise feeding takes a step per prompt token (large-v3,
            # H200, one window: 0.115 -> 0.113 s, time to first token 0.012-0.014 -> 0.010-0.012 s; BENCHMARKS.md,
            # fourteenth session)
            replayed = runner.prompt_graph_fits(new)
            if short and not replayed and running_before < STEPWISE_MAX_RUNNING and not sched.num_waiting:
                for seq in new:  # the prompt is fed by the decode steps below, one token each
                    seq.forced.extend(seq.pending[1:])
                    del seq.pending[1:]
            else:
                tokens, logprobs = runner.prefill(new)  # reads its rows' state before _launched advances it
                self._complete(self._launched(new), tokens, logprobs, latest=True)
        launched = None
        if sched.running:
            # several greedy steps in one launch while a few windows decode and none waits (ModelRunner.multi_steps)
            k = 1 if new or sched.num_waiting else runner.multi_steps(sched.running)
            if k > 1:
                output = runner.decode_multi(sched.running, keep=self.overlap_steps)
                launched = (self._launched_steps(sched.running, k), output)
            else:
                output = runner.decode(sched.running, keep=self.overlap_steps)
                launched = (self._launched(sched.running), output)
        if self._in_flight is not None:
            self._complete(self._in_flight[0], *self._in_flight[1].result(), latest=False)
        self._in_flight = launched if self.overlap_steps else None
        if launched is not None and not self.overlap_steps:
            self._complete(launched[0], *launched[1].result(), latest=True)
        if new or launched is not None:  # not the read of a last step that launched nothing after it
            self.num_steps += 1

    def _align(self, seq: Sequence) -> None:
        t = seq.job.transcription
        language = seq.language or t.language or "en"
        text = t.tokens_to_align(seq)
        seq.alignment = self.runner.align(seq, text, language, t.task.value, seq.job.num_frames)

    def _launched(self, seqs: list[Sequence]) -> list[tuple[Sequence, int, int]]:
        """What the host knows as soon as a step is launched: positions advance, forced prompt tokens are next, and
        a sampled token (or language pick) will be fed back from the device. Returns (sequence, mode, positions
        cached after the step) per row for `_complete`."""
        record = []
        for row, seq in enumerate(seqs):
            seq.num_cached += len(seq.pending)
            seq.row = row
            if seq.forced:  # prompt tokens still to feed: the model's output is not used
                mode = FORCED
                seq.pending = [seq.forced.popleft()]
            elif seq.detecting:  # the model's pick among language tokens, then the rest of the prompt
                mode = DETECT
                seq.detecting = False
                seq.forced.extend(seq.job.forced_after_language)
                seq.pending = [ON_DEVICE]
            else:
                mode = SAMPLE
                seq.num_launched += 1
                seq.pending = [ON_DEVICE]
            record.append((seq, mode, seq.num_cached))
        return record

    def _launched_steps(self, seqs: list[Sequence], k: int) -> list[tuple[Sequence, int, int]]:
        """_launched for k greedy steps in one launch (every sequence sampling): the records of step 0 for every
        row, then step 1, ..., in the order of the launch's output; the last step's tokens stay on the device."""
        record = []
        for _ in range(k):
            for seq in seqs:
                seq.num_cached += 1
                seq.num_launched += 1
                record.append((seq, SAMPLE, seq.num_cached))
        for row, seq in enumerate(seqs):
            seq.row = row
            seq.pending = [ON_DEVICE]
        return record

    def _complete(
        self, record: list[tuple[Sequence, int, int]], tokens: list[int], logprobs: list[float], latest: bool
    ) -> None:
        """A step's results: tokens appended, ends found, finished windows released. A sequence that ended in an
        earlier step was still in this one (launched before that end was read): its row is ignored. `latest`: no
        step was launched after this one, so the next step's inputs can come from the host again."""
        tok = self.tokenizer
        # a launch of several steps holds several records per sequence: its next input is its last one's token
        last = {id(seq): i for i, (seq, _, _) in enumerate(record)} if latest else {}
        for i, ((seq, mode, cached), token, logprob) in enumerate(zip(record, tokens, logprobs)):
            if latest and last[id(seq)] == i:
                seq.row = None
                if seq.pending[0] == ON_DEVICE:
                    seq.pending = [token]
            if mode == FORCED or seq.finished:
                continue
            t = seq.job.transcription
            if t.first_token_at is None:
                t.first_token_at = time.perf_counter()
            if mode == DETECT:
                seq.language = tok.language_codes[token]
                continue
            seq.sum_logprob += logprob
            fixed = seq.job.fixed_decode_tokens
            if token == tok.eot and fixed is None:
                seq.finished = True
                continue
            seq.tokens.append(token)
            self.num_tokens += 1
            if token >= tok.timestamp_begin:
                seq.last_timestamp = token
            if (fixed is not None and len(seq.tokens) >= fixed) or cached + 1 >= self.runner.n_text_ctx:
                seq.finished = True  # clean stop at the decoder's context limit
        self._release()

    def _release(self) -> None:
        for seq in self.scheduler.running:
            if seq.finished and not seq.aborted and seq.job.word_timestamps:
                self._align(seq)  # needs the slot's cross-attention cache, so before the slot is reused
        for seq in self.scheduler.release_finished(self.runner.cache):
            if seq.aborted:
                continue
            t = seq.job.transcription
            try:
                job = t.on_window_done(seq)
            except Exception as exc:  # a bug in one request's bookkeeping must not take down the others
                if not isinstance(exc, EngineError):
                    log.exception("request %s failed", t.request_id)
                    exc = EngineInternalError("finishing a window failed")
                t.aborted = True
                job = None
                self._transcriptions.pop(t.request_id, (None, None))[1].emit(exc)
            if job is not None:
                self.scheduler.add(job, continuing=True)
            elif t.done:
                self._transcriptions.pop(t.request_id, None)
