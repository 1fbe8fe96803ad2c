"""TeamSize: how many threads the native CPU kernels run a decode step on, the full team or one, measured.

Why: a decode step is ~10 short parallel loops per layer, and each ends at a barrier. With the cores to itself the
full team is faster. Beside a competing load (other processes, a CPU quota smaller than the core count) the OS
deschedules one of the team's threads now and then, and every barrier waits for it; one thread never waits for
another, and is then the faster (`python benchmarks/cpu_int8.py --load 0 2 --fixed-team`: BENCHMARKS.md). Which
team wins changes with the machine's load while the server runs, so it is measured on the steps themselves: the
current choice runs most steps, and now and then a probe alternates steps of the other choice with steps of the
current one, so that both see the same load; when the other's median step is lower by a margin, it takes over. A
probe that loses costs time, so the next one comes after enough steps that this cost stays a few percent of theirs
(BUDGET), whether a probe's steps cost a few times the current ones' (the full team beside a load) or a little
more (one thread, quiet). The comparison is per kind of step (one row, several rows), whose costs differ.

The choice changes only how many threads share a step's work: each output column and each (row, head) is computed
by one thread in the same order either way, so the results are bit-identical.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

ROUND = 24  # the fewest steps of the current choice between probes
PROBES = 4  # steps of each choice in a probe, alternating, so that both see the same load
BUDGET = 0.03  # a losing probe's extra time, as a fraction of the steps until the next probe: the spacing
MAX_WAIT = 256  # the most steps between probes, so that a change in the load is seen within about a second
MARGIN = 0.9  # the other choice takes over when its median step is below this fraction of the current one's: above
# the noise of a shared machine, so that quiet steps do not flap, and far below what a load makes of the full team


class StepChoice:
    """One kind of step's state: the current team size, and the step times of the probe under way."""

    def __init__(self, full: int):
        self.current, self.other = full, 1
        self.left = ROUND  # steps of the current choice before the next probe
        self.mine: list[float] = []
        self.theirs: list[float] = []

    def next_size(self) -> int:
        if self.left:
            return self.current
        return self.other if len(self.theirs) == len(self.mine) else self.current

    def record(self, size: int, seconds: float) -> None:
        if self.left:
            self.left -= 1
            return
        (self.theirs if size == self.other else self.mine).append(seconds)
        if len(self.mine) < PROBES:
            return
        mine, theirs = statistics.median(self.mine), statistics.median(self.theirs)
        if theirs < MARGIN * mine:
            self.current, self.other = self.other, self.current
            self.left = ROUND
        else:
            self.left = min(MAX_WAIT, max(ROUND, math.ceil(PROBES * (theirs - mine) / (BUDGET * mine))))
        self.mine, self.theirs = [], []


class TeamSize:
    """Per decode step: `with team.step(rows) as size:` runs the step's kernels on `size` threads and times it.
    `full`: the team torch uses (its thread count); with one thread, or `adaptive` off, always that."""

    def __init__(self, full: int, adaptive: bool = True):
        self.full = full
        self.adaptive = adaptive and full > 1
        self.choices = {False: StepChoice(full), True: StepChoice(full)}  # by "several rows"

    @contextmanager
    def step(self, rows: int) -> Iterator[int]:
        if not self.adaptive:
            yield self.full
            return
        choice = self.choices[rows > 1]
        size = choice.next_size()
        start = time.perf_counter()
        yield size
        choice.record(size, time.perf_counter() - start)

    def sizes(self) -> dict[str, int]:
        """The current choice per kind of step (for logs and tests)."""
        return {"one row": self.choices[False].current, "several rows": self.choices[True].current}
