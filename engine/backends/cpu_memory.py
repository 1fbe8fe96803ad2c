"""Keep large CPU tensors on the heap: glibc otherwise maps and unmaps each one, faulting in every page anew."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = (1 << 31) - 1) -> bool:
    """Ask glibc to serve allocations below `mmap_threshold` (32 MiB is the most it accepts on 64-bit) from
    the heap and to keep up to `trim_threshold` of freed heap instead of returning it to the kernel.

    An encoder pass allocates tens of activation tensors of several MiB each. By default glibc serves each
    with its own mmap and unmaps it on free, so the next pass takes a page fault on every 4 KiB page again:
    thousands of faults per pass and a large share of the pass spent in the kernel, where these settings leave
    almost none (`python benchmarks/cpu_components.py`, against `--default-heap`). The cost is that the process
    keeps its peak heap. The same effect is what the usual advice of preloading jemalloc or tcmalloc for PyTorch
    on CPUs buys; this needs no preload. Returns False where the C library is not glibc (nothing is changed there).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    if not ok:
        log.warning("mallopt refused the heap settings; large CPU tensors will be mapped per allocation")
    return ok
