"""How long an idle OpenMP thread spins before it sleeps, set before anything loads torch (libgomp reads it once).

torch, the native CPU kernels and CTranslate2 share libgomp, whose threads spin about 300,000 times at the end of
each parallel region (milliseconds) waiting for the next. That suits a machine the process owns. Where the cores
are shared (other containers, the busy neighbours of `benchmarks/cpu_int8.py --load 2`), a thread spinning for a
partner that the kernel descheduled burns the time slice the partner needs, and each of a decode step's ~30
regions can wait a whole slice: the steps then took four times as long instead of two. 3,000 spins (some 50-100
microseconds) still bridge the gap between the regions of one step, so a quiet machine loses nothing, and a
waiting thread sleeps long before it costs a slice. An operator's own `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` wins."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPIN_COUNT = "3000"


def set_spin_default(environ: MutableMapping[str, str] = os.environ) -> None:
    """Sets GOMP_SPINCOUNT unless the environment already says how OpenMP threads wait; child processes inherit it."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
