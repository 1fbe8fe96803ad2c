"""Scheduler: waiting windows, slot admission, and keeping running sequences in slots [0, n)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from engine.model.kv_cache import KVCache
from engine.runtime.sequence import Sequence, WindowJob

# How far into the new windows an admission looks for windows of the adapters it takes, in encoder batches; those
# it passes over keep their places, so every admission still takes the oldest waiting window
ADAPTER_LOOKAHEAD_BATCHES = 4


class Scheduler:
    """
    Policy: a request's next window (or fallback retry) is admitted before any new request, so work
    in flight finishes first and memory stays bounded; new requests are served first come, first served;
    background requests (DecodeOptions.background: previews) only get slots no other window waits for.
    Each step admits at most `max_encoder_batch` windows so running sequences wait for at most one
    encoder batch between decode steps. While the engine paces admissions (`admit(pace=True)`), a window that
    continues a request waits as long as another request's sequences decode: a long upload's next window (an
    encoder pass that costs a CPU forty decode steps) must not stall a short request's steps again and again; a
    background window waits likewise while `pace_background` (which the engine holds longer). New requests are
    never held back. With `group_adapters` (a GPU serving LoRA adapters, whose encoder runs each adapter's windows
    of a pass on its merged weights when they are many) new windows of one adapter are admitted together: the next
    batch takes, after the first waiting window, the windows of its adapter among the next few batches' worth, then
    the next adapter's, in the order the adapters first appear; the windows passed over keep their places, so the
    oldest still comes first in the next batch.
    """

    def __init__(
        self, num_slots: int, max_encoder_batch: int, admissible: Callable[[int], int] = lambda n: n,
        num_cross_slots: int | None = None, group_adapters: bool = False,
    ):  # fmt: skip
        self.num_slots = num_slots  # rows: sequences decoded at once
        self.num_cross_slots = num_cross_slots or num_slots  # windows decoded at once
        self.max_encoder_batch = max_encoder_batch
        self.admissible = admissible  # rounds a batch to a captured encoder size when padding would waste
        self.group_adapters = group_adapters
        self.waiting_next: deque[WindowJob] = deque()  # windows of requests already in flight
        self.waiting_new: deque[WindowJob] = deque()  # first windows of new requests
        self.waiting_background: deque[WindowJob] = deque()  # any window of a background request
        self.running: list[Sequence] = []  # running[i].slot == i
        # waiting windows that the last admit() would have taken but for the size of its batch (the rows, the
        # encoder batch): not those its pacing held back, which a launch of several decode steps does not delay
        self.ready_waiting = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting_next) + len(self.waiting_new) + len(self.waiting_background)

    @property
    def queues(self) -> tuple[deque[WindowJob], ...]:
        """The waiting windows, in the order they are admitted."""
        return self.waiting_next, self.waiting_new, self.waiting_background

    def has_work(self) -> bool:
        return bool(self.running or self.num_waiting)

    def add(self, job: WindowJob, continuing: bool) -> None:
        if job.background:
            self.waiting_background.append(job)
        else:
            (self.waiting_next if continuing else self.waiting_new).append(job)

    def admit(self, pace: bool = False, pace_background: bool | None = None) -> list[Sequence]:
        """Give free rows and cross slots to waiting windows; the new sequences take the rows right after the
        running ones. A window decoded with beam search takes one row per beam, side by side, and one cross slot
        that its beams share (the runner makes them its beams: ModelRunner.admit). `pace`: hold back continuing
        windows while other requests' sequences run; `pace_background` (None: as `pace`) background ones."""
        waiting = self.num_waiting
        rows = self.num_slots - len(self.running)
        self.ready_waiting = waiting
        if not waiting or not rows:  # most steps: nothing to admit, and nothing is counted (per step, per slot)
            return []
        held = self._held(pace, pace if pace_background is None else pace_background)
        if held is not None:  # less the held, so that the encoder batch below is sized for what is taken
            waiting -= sum(held(job) for queue in (self.waiting_next, self.waiting_background) for job in queue)
        cross = self._free_cross(min(rows, self.max_encoder_batch, waiting))
        free = self.admissible(len(cross)) if cross else 0
        jobs = self._take(free, rows, held)
        self.ready_waiting = waiting - len(jobs)
        admitted: list[Sequence] = []
        for job, slot in zip(jobs, cross):
            admitted += [self._sequence(job, len(self.running) + len(admitted) + b, slot) for b in range(job.beam_size)]
        self.running.extend(admitted)
        return admitted

    def _free_cross(self, limit: int) -> list[int]:
        """Up to `limit` cross slots that no running sequence reads, lowest first (the plan may hold thousands)."""
        used = {s.cross_slot for s in self.running}
        return list(itertools.islice((c for c in range(self.num_cross_slots) if c not in used), max(limit, 0)))

    def _held(self, pace: bool, pace_background: bool) -> Callable[[WindowJob], bool] | None:
        """While pacing, a continuing (background) window waits if another request's sequences are running (a
        request's own windows do not slow another's); None: nothing is paced."""
        if not (pace or pace_background):
            return None
        running = {s.job.request_id for s in self.running}

        def held(job: WindowJob) -> bool:
            paced = pace_background if job.background else pace
            return paced and (len(running) > 1 or (bool(running) and job.request_id not in running))

        return held

    def _take(self, free: int, slots: int, held: Callable[[WindowJob], bool] | None) -> list[WindowJob]:
        """Up to `free` waiting windows, in queue order (new windows by adapter with `group_adapters`), whose beams
        fit in `slots` together, passing over the continuing and background windows `held` names; first come, first
        served: no later window jumps ahead of one that does not fit."""
        ahead = self._by_adapter(self.waiting_new) if self.group_adapters else None
        jobs = self._take_in_order(free, slots, held)
        if ahead is not None:  # the windows passed over back to their places, ahead of the rest in their order
            taken = {id(job) for job in jobs}
            left = [job for job in ahead if id(job) not in taken]
            for _ in range(len(left)):
                self.waiting_new.popleft()
            self.waiting_new.extendleft(reversed(left))
        return jobs

    def _take_in_order(self, free: int, slots: int, held: Callable[[WindowJob], bool] | None) -> list[WindowJob]:
        jobs: list[WindowJob] = []
        used = 0
        for queue in self.queues:
            passed: list[WindowJob] = []  # held: back to the queue's front, in their order
            check = held if queue is not self.waiting_new else None
            while queue and len(jobs) < free:
                job = queue[0]
                if check is not None and check(job):
                    passed.append(queue.popleft())
                    continue
                if used + job.beam_size > slots:
                    queue.extendleft(reversed(passed))
                    return jobs
                jobs.append(queue.popleft())
                used += job.beam_size
            queue.extendleft(reversed(passed))
        return jobs

    def _by_adapter(self, queue: deque[WindowJob]) -> list[WindowJob] | None:
        """Put the queue's first ADAPTER_LOOKAHEAD_BATCHES batches' worth of windows in order of adapter, each
        adapter's in the order they came, the adapters in the order they first appear (the first window stays
        first); returns those windows in their own order, or None where they all use one adapter."""
        ahead = list(itertools.islice(queue, ADAPTER_LOOKAHEAD_BATCHES * self.max_encoder_batch))
        first: dict[str | None, int] = {}
        for job in ahead:
            first.setdefault(job.options.adapter, len(first))
        if len(first) < 2:
            return None
        for _ in range(len(ahead)):
            queue.popleft()
        ordered = sorted(ahead, key=lambda job: first[job.options.adapter])
        queue.extendleft(ordered[::-1])
        return ahead

    @staticmethod
    def _sequence(job: WindowJob, slot: int, cross_slot: int) -> Sequence:
        seq = Sequence(job=job, slot=slot, cross_slot=cross_slot, pending=list(job.prompt))
        seq.detecting = job.detect_language
        return seq

    def drop(self, request_id: str) -> None:
        """A request that ended early (aborted, failed): its waiting windows are dropped, its running sequences end
        at the next release."""
        for q in self.queues:
            kept = [j for j in q if j.request_id != request_id]
            q.clear()
            q.extend(kept)
        for seq in self.running:
            if seq.job.request_id == request_id:
                seq.finished = seq.aborted = True

    def release_finished(self, cache: KVCache) -> list[Sequence]:
        """Remove finished sequences and fill their rows from the tail, so the running range stays contiguous (only
        self-attention caches move; a cross slot is free once no running sequence reads it)."""
        finished = [s for s in self.running if s.finished]
        if not finished:
            return []
        keep = len(self.running) - len(finished)
        holes = [s.slot for s in finished if s.slot < keep]
        movers = [s for s in self.running[keep:] if not s.finished]
        moves = []
        for hole, seq in zip(holes, movers):
            moves.append((seq.slot, hole, seq.num_cached))
            seq.slot = hole
        cache.move_slots(moves)
        self.running = sorted((s for s in self.running if not s.finished), key=lambda s: s.slot)
        return finished
