"""The diarization threads' CPU priority: below the engine's, so that speaker models yield the cores to decoding.

On a machine of few cores the diarization models (Silero VAD, CAM++ embeddings, clustering) would otherwise take
their share of every core beside the engine's decode, and a plain request beside long diarized ones waits for
both. A thread on Linux is a task of its own with its own nice value, and the threads it creates inherit it: the
OpenMP team that torch, MKL and scikit-learn give each calling thread (libgomp builds one per thread that opens a
parallel region) runs at the caller's priority. A niced thread still gets every core nobody else wants, so a
quiet machine diarizes as fast as before. Raising a thread's nice value needs no privilege; lowering it again
does, so only threads the diarizer owns are niced (its pools' initializers), never a caller's.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

MAX_NICE = 19  # Linux's lowest priority


def lower_priority(nice: int) -> None:
    """This thread (and the threads it creates from now on) at `nice` (0: unchanged); Linux only, elsewhere a
    no-op (setpriority there takes a process, not a thread)."""
    if nice <= 0 or sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as exc:  # a sandbox that forbids it: diarization still runs, at the engine's priority
        log.warning("could not lower the diarization thread's priority: %s", exc)


def lower_process_priority(nice: int) -> None:
    """Every thread of this process at `nice`, those started while it imported its libraries (OpenBLAS starts its
    own at load) included; the threads they start later inherit it."""
    if nice <= 0 or sys.platform != "linux":
        return
    for task in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task), max(nice, os.getpriority(os.PRIO_PROCESS, int(task))))
        except OSError as exc:  # the thread has ended, or a sandbox forbids it
            log.debug("could not lower thread %s's priority: %s", task, exc)
