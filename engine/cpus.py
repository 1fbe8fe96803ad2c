"""How many cores this process may use: its CPU affinity, capped by a cgroup CPU quota (a container's `--cpus`,
a Kubernetes CPU limit). torch's default thread count is the machine's cores, whatever the quota: a container
limited to one CPU would run two or more threads that take turns on it, each step waiting for the throttled one."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def available_cpus() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_quota() -> float | None:
    """The CPU quota in cores (cgroup v2's cpu.max, else v1's CFS quota), or None when there is none."""
    try:
        quota, period = CGROUP_V2.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota, period = (int(p.read_text()) for p in CGROUP_V1)
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None
