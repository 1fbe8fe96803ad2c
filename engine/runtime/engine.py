"""Engine: an inbox, one loop thread that admits, launches, reads and postprocesses, and per-request handles."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future

import numpy as np
import torch

from engine.audio.feature_worker import FeatureWorker
from engine.config import EngineConfig
from engine.decoding import BeamGroup
from engine.frontend import EngineFront, RequestHandle, check_audio
from engine.messages import AbortRequest, AddRequest, ChangeAdapter
from engine.model.lora import AdapterError
from engine.request import (
    DecodeOptions,
    EngineDeadError,
    EngineInternalError,
    EngineOverloadedError,
    EngineStats,
    InvalidRequestError,
    TranscriptionResult,
)
from engine.runtime.model_runner import ModelRunner
from engine.runtime.request_table import RequestTable
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import LaunchedRow, Output, Sequence
from engine.runtime.step_io import StepOutput

log = logging.getLogger(__name__)
# Short prompts ride along with the decode steps only while fewer sequences than this are running and no window
# is left waiting. With a few rows a step is short, so a prompt pass (~600 eager kernel launches on a GPU) would
# dominate; with many, or with a backlog, the pass is shared by a large admitted batch, and admitting quickly in
# large encoder batches matters more: step-wise feeding at every batch size lost throughput on a burst of 256
# windows because the burst was admitted in twice as many encoder batches
# (`benchmarks/gpu_throughput.py --stepwise-prompt-tokens 8` against 0).
STEPWISE_MAX_RUNNING = 64
ADAPTER_CHANGE_TIMEOUT_S = 120.0  # loading an adapter reads its file between two steps


@dataclasses.dataclass(slots=True)
class Launch:
    """A launched step: its rows in launch order, and their outputs on the way to the host."""

    rows: list[LaunchedRow]
    output: StepOutput


class Engine(EngineFront):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.inbox: queue.SimpleQueue[AddRequest | AbortRequest | ChangeAdapter | None] = queue.SimpleQueue()
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
        self.num_slots = self.runner.num_slots
        self.adapter_names = self.runner.adapter_names()
        # On a GPU new requests' log-mels are computed beside the loop; on a CPU the loop computes them itself,
        # so that one OpenMP thread team does all the work (a second team would compete for the cores).
        self._features = FeatureWorker(self.runner.log_mel, self.inbox.put) if self.runner.on_gpu else None
        stepwise = config.stepwise_prompt_tokens
        self.stepwise_prompt_tokens = stepwise if stepwise is not None else (8 if self.runner.on_gpu else 0)
        runner = self.runner
        self.scheduler = Scheduler(
            runner.num_slots,
            runner.max_encoder_batch,
            runner.admissible_encoder_batch,
            runner.num_cross_slots,
            group_adapters=runner.on_gpu and runner.adapters is not None,
        )
        # On a GPU step N+1 is launched before step N's tokens are read, so the host's work between steps (reading,
        # bookkeeping, the next step's inputs and rules) runs while the GPU computes instead of leaving it idle.
        # A CPU computes while the host works anyway: there each step is read right after it is launched.
        overlap = config.overlap_steps
        self.overlap_steps = self.runner.on_gpu if overlap is None else overlap
        self._in_flight: Launch | None = None
        self._admitted_at = 0.0  # when the last admission (encoder pass and prompts) ended, and what it took
        self._admission_s = 0.0
        self.background_pace = config.background_pace
        self.requests = RequestTable(runner, self.scheduler, self._mark_started)
        self.num_steps = 0
        self.num_tokens = 0
        self.busy_seconds = 0.0  # time spent in step(): busy / wall time is how loaded the engine is
        self.single_steps: collections.Counter[str] = collections.Counter()  # by what kept a launch to one step
        # windows whose language the model picked: each a step of its own, then a step per forced task token
        self.language_picks = 0
        self.windows_encoded = 0  # encoder passes, one per window (a beam search's beams share theirs)

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
            batch_invariant=self.runner.backend.batch_invariant,
            extra=self._totals(),
        )

    def _totals(self) -> dict[str, float]:
        totals = {"steps": float(self.num_steps), "tokens": float(self.num_tokens), "busy_seconds": self.busy_seconds,
                  "language_picks": float(self.language_picks),
                  "windows_encoded": float(self.windows_encoded)}  # fmt: skip
        # a copy first: the loop's thread may add a reason meanwhile (dict() copies under the GIL, in one call)
        totals.update((f"single_steps_{reason}", float(n)) for reason, n in dict(self.single_steps).items())
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
        """submit() for samples and options already checked and prepared: the engine process's child, whose parent
        did both, so the scan of every sample is not repeated beside this engine's loop."""
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        request_id = request_id or f"req-{next(self._ids)}"
        with self._lock:
            if len(self._unstarted) >= self.config.max_waiting:
                raise EngineOverloadedError(f"{len(self._unstarted)} requests are already waiting; retry later")
            self._unstarted.add(request_id)
        handle = self.make_handle(request_id)
        self._send(AddRequest(handle, np.ascontiguousarray(audio, dtype=np.float32), options))
        return handle

    def make_handle(self, request_id: str) -> RequestHandle:
        """The handle a request's events go to (the engine process's child forwards them to its parent instead)."""
        return RequestHandle(self, request_id)

    def on_started(self, request_id: str) -> None:
        """Called on the loop thread when a request no longer waits: its first window got a decode slot, or it
        ended before (failed, aborted, nothing to decode)."""

    def abort(self, request_id: str) -> None:
        self._send(AbortRequest(request_id))

    def _send(self, msg: AddRequest | AbortRequest) -> None:
        """Into the loop's inbox, through the feature worker when there is one (it keeps the order)."""
        (self._features.put if self._features is not None else self.inbox.put)(msg)

    def change_adapter(self, name: str, folder: str | None) -> None:
        """Load the LoRA adapter `name` from a PEFT directory, or remove it (folder None), between two steps of the
        loop; AdapterError says why not (a bad adapter, the cap reached, one still in use)."""
        done: Future = Future()
        self.inbox.put(ChangeAdapter(name, folder, done))
        done.result(timeout=ADAPTER_CHANGE_TIMEOUT_S)
        self.adapter_names = self.runner.adapter_names()

    def transcribe(self, audio: np.ndarray, options: DecodeOptions | None = None) -> TranscriptionResult:
        """Blocking convenience for scripts and the CLI."""
        self.start()
        return self.submit(audio, options or DecodeOptions()).wait()

    # ---- the loop ---------------------------------------------------------------------------------

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
                if self.requests.features_pending:
                    self.requests.advance_features()
                if self.scheduler.has_work() or self._in_flight is not None:
                    try:
                        self.step()
                    except Exception as exc:  # fail the requests in this step, keep serving the others
                        self._fail_running(exc)
                self.busy_seconds += time.perf_counter() - start
        except BaseException as exc:  # a real fault: fail every request, keep the reason for /health
            log.exception("engine loop died")
            self._error = exc
            self.requests.fail_all(exc)
            return
        # shut down: what it still holds, and what was submitted meanwhile, learns that it stopped (a server
        # unloading a model answers those requests)
        stopped = EngineDeadError("the engine was shut down")
        self.requests.end_all(stopped)
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, AddRequest):
                msg.handle.emit(stopped)

    def step(self) -> None:
        """One turn of the loop: admit waiting windows, launch a decode step for every running sequence, read the
        step launched before it (overlapped) or this one (not), and act on what was sampled."""
        if self._in_flight is not None and any(s.host_bound for s in self.scheduler.running):
            # a keyword row's next bonuses follow from its last token, and the next beams from the group's
            # candidates: read the step in flight before launching
            self._postprocess(self._in_flight.rows, *self._in_flight.output.result(), latest=True)
            self._in_flight = None
        admitted = self._admit()
        launch = self._launch(admitted)
        if self._in_flight is not None:
            self._postprocess(self._in_flight.rows, *self._in_flight.output.result(), latest=False)
        self._in_flight = launch if self.overlap_steps else None
        if launch is not None and not self.overlap_steps:
            self._postprocess(launch.rows, *launch.output.result(), latest=True)
        if admitted or launch is not None:  # not the read of a last step that launched nothing after it
            self.num_steps += 1

    def _admit(self) -> list[Sequence]:
        """Waiting windows into free slots: the encoder writes their cross-attention caches, and their prompts go
        through a prompt pass, or one token per decode step (`stepwise_prompt_tokens`) while the batch is small,
        none waits and no graph replays their prompt pass."""
        sched, runner = self.scheduler, self.runner
        # Paced: until the running sequences have decoded for as long as the last admission took, only new
        # requests are admitted, so that a long upload's windows take at most about half of the loop from
        # another request's steps (host time: on a GPU the launches return before the kernels end, and rarely pace);
        # background windows (previews) wait `background_pace` times as long, and then go together
        started = time.perf_counter()
        since = started - self._admitted_at
        new = sched.admit(
            pace=since < self._admission_s, pace_background=since < self.background_pace * self._admission_s
        )
        if not new:
            return new
        runner.admit(new)
        for seq in new:
            self._mark_started(seq.job.request_id)
        # one encoder pass and one cross slot per window, which a beam search's beams share
        windows = [s for s in new if not s.beam_follower]
        self.windows_encoded += len(windows)
        runner.encode_into_slots(
            [s.job.mel for s in windows], [s.cross_slot for s in windows], [s.job.options.adapter for s in windows]
        )
        short = all(len(s.pending) <= self.stepwise_prompt_tokens for s in new)
        small_batch = len(sched.running) - len(new) < STEPWISE_MAX_RUNNING and not sched.num_waiting
        if short and small_batch and not runner.prompt_graph_fits(new):
            for seq in new:
                seq.feed_prompt_stepwise()
        else:
            tokens, logprobs = runner.prefill(new)  # reads its rows' state before launch() advances it
            self._postprocess([seq.launch(row) for row, seq in enumerate(new)], tokens, logprobs, latest=True)
        self._admitted_at = time.perf_counter()
        self._admission_s = self._admitted_at - started
        return new

    def _launch(self, admitted: list[Sequence]) -> Launch | None:
        """One decode step for every running sequence, or several greedy steps in one launch while a few windows
        decode and none waits to be admitted but for its pacing (ModelRunner.no_multi_step). The runner reads each
        sequence before launch() advances it."""
        running = self.scheduler.running
        if not running:
            return None
        k = self.runner.multi_step
        if k > 1:  # why a launch takes one step where it might take several: counted, for /metrics
            blocker = "admitted" if admitted else "waiting" if self.scheduler.ready_waiting else None
            blocker = blocker or self.runner.no_multi_step(running)
            if blocker is not None:
                self.single_steps[blocker] += 1
                k = 1
        if k > 1:
            output = self.runner.decode_multi(running, keep=self.overlap_steps)
            launched = [seq.launch_greedy(k, row) for row, seq in enumerate(running)]
            rows = [per_seq[j] for j in range(k) for per_seq in launched]  # the output's order: step by step
        else:
            output = self.runner.decode(running, keep=self.overlap_steps)
            rows = [seq.launch(row) for row, seq in enumerate(running)]
        return Launch(rows, output)

    def _postprocess(self, rows: list[LaunchedRow], tokens: list[int], logprobs: list[float], latest: bool) -> None:
        """A step's results: tokens appended, ends found, finished windows released. A sequence that ended in an
        earlier step was still in this one (launched before that end was read): its row is ignored. `latest`: no
        step was launched after this one, so the next step's inputs can come from the host again."""
        tok, now = self.tokenizer, time.perf_counter()
        # a launch of several steps holds several rows per sequence: its next input is its last one's token
        last = {id(r.seq): i for i, r in enumerate(rows)} if latest else {}
        beams: dict[int, tuple[BeamGroup, int]] = {}  # each group read in this step: its first row's cached count
        for i, (r, token, logprob) in enumerate(zip(rows, tokens, logprobs)):
            seq = r.seq
            if latest and last[id(seq)] == i:
                seq.settle(token)
            if r.output is Output.FORCED or seq.finished:
                continue
            if not seq.tokens:  # the window's first output: its request's first, unless a window came before
                self.requests.first_output(seq.job.request_id, now)
            if r.output is Output.LANGUAGE:
                seq.language = tok.language_codes[token]
                self.language_picks += 1
            elif seq.beam is not None:  # the group's candidates decide, below
                beams.setdefault(id(seq.beam), (seq.beam, r.num_cached))
            elif seq.append(token, logprob, r.num_cached, tok.eot, tok.timestamp_begin, self.runner.n_text_ctx):
                self.num_tokens += 1
        if beams:
            copies, positions, n = self.runner.beam_search.advance(list(beams.values()))
            self.num_tokens += n
            if copies:  # every group's forks of this step, copied in one call
                self.runner.cache.copy_self(copies, positions)
        self._finish_windows()

    def _finish_windows(self) -> None:
        """Finished windows leave their slots (aligned first, for word timestamps: that reads the slot's cross
        cache); their transcriptions queue the next window, a retry, or finish."""
        for seq in self.scheduler.running:
            if seq.finished and not seq.aborted and seq.job.word_timestamps and not seq.beam_follower:
                text, language, task = self.requests.to_align(seq)
                seq.alignment = self.runner.align(seq, text, language, task, seq.job.num_frames)
        for seq in self.scheduler.release_finished(self.runner.cache):
            if not seq.aborted and not seq.beam_follower:
                for job in self.requests.window_done(seq):
                    self.scheduler.add(job, continuing=True)

    def _fail_running(self, exc: Exception) -> None:
        log.exception("engine step failed; failing the requests it was decoding")
        self._in_flight = None
        self.runner.reset_steps()
        for seq in list(self.scheduler.running):
            self.requests.fail(seq.job.request_id, EngineInternalError("decoding failed"))
        self.scheduler.running = []

    # ---- requests in and out ----------------------------------------------------------------------

    def _has_work(self) -> bool:
        return self.scheduler.has_work() or self._in_flight is not None or bool(self.requests.features_pending)

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                msg = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if msg is None:
                return
            if isinstance(msg, AddRequest):
                adapter = msg.options.adapter
                if adapter is not None and adapter not in self.runner.adapter_names():  # removed since its submit
                    self.requests.refuse(msg.handle, InvalidRequestError(f"The adapter {adapter!r} is not loaded",
                                                                         "model"))  # fmt: skip
                else:
                    self.requests.add(msg)
            elif isinstance(msg, ChangeAdapter):
                self._change_adapter(msg)
            else:
                self.requests.abort(msg.request_id)

    def _change_adapter(self, msg: ChangeAdapter) -> None:
        try:
            if msg.folder is not None:
                self.runner.load_adapter(msg.name, msg.folder)
            elif self.requests.uses_adapter(msg.name):
                raise AdapterError(f"requests are queued or decoding with the adapter {msg.name!r}")
            else:
                self.runner.remove_adapter(msg.name)
        except Exception as exc:  # noqa: BLE001 - the caller's to raise (an AdapterError, or what loading hit)
            if not isinstance(exc, AdapterError):  # its message may name local files: the caller gets its kind only
                log.warning("loading the adapter %s failed: %r", msg.name, exc)
                exc = AdapterError(f"the adapter {msg.name!r} could not be loaded ({type(exc).__name__})")
            msg.done.set_exception(exc)
        else:
            msg.done.set_result(None)

    def _mark_started(self, request_id: str) -> None:
        with self._lock:
            if request_id not in self._unstarted:
                return
            self._unstarted.discard(request_id)
        self.on_started(request_id)
