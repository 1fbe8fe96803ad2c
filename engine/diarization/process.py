"""DiarizerProcess: SpeakerDiarizer in a child process of its own, every thread of it at a low CPU priority.

Why a process: in the server's own process the diarization models' Python work (senko's pipeline, Silero's loop
over 32 ms frames) shares one GIL with the engine's loop thread and the event loop. At a low priority that is a
priority inversion: a niced diarization thread that holds the GIL is the last to get a core, and the engine and
the event loop wait for it: beside two 3-minute diarized requests, one plain request of about a second took 209 s
(`--no-diarization-process` in benchmarks/diarization_beside_plain.py, a 2-core machine with other work on it).
With a GIL of its own the diarizer only takes the CPU time the engine's process leaves (priority.py). What crosses the pipe: each pass's jobs (samples,
references, counts) pickled one way, its turns or its error the other.

The child starts on first use (or load(), at start-up), loads the models there, and serves one pass at a time. If
it dies, that pass fails (its requests get a 500) and the next pass starts a new one.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from engine.diarization.pipeline import Diarization, DiarizationJob, SpeakerCount, SpeakerDiarizer
from engine.diarization.priority import MAX_NICE, lower_process_priority
from engine.processes.child import ChildProcess, picklable, setup_child

log = logging.getLogger(__name__)

PROCESS_NAME = "whisper-diarize"  # what ps and top show for the child (Linux's limit: 15 characters)


class DiarizerProcess:
    """SpeakerDiarizer's interface (load, diarize, diarize_many, last_pass, device, nice) over a child process."""

    def __init__(self, device: str = "cpu", nice: int = MAX_NICE):
        if not 0 <= nice <= MAX_NICE:
            raise ValueError(f"nice must be between 0 and {MAX_NICE}, got {nice}")
        self.device = device
        self.nice = nice
        self.last_pass: dict[str, float] = {}
        self._lock = threading.Lock()  # one call at a time on the pipe
        self._child = ChildProcess(_child_main, (device, nice), "whisper-diarization", "speaker diarization process")

    def load(self, why: str = "for the first request that asks for speakers") -> None:
        """The child started and its models loaded (seconds: the server can call it at start-up)."""
        with self._lock:
            self._child.call(("load", why))

    def diarize(
        self, audio: np.ndarray, known: list[tuple[str, np.ndarray]] | None = None, count: SpeakerCount | None = None
    ) -> Diarization:
        """One recording (see diarize_many); its failure raises."""
        (result,) = self.diarize_many([DiarizationJob(audio, known, count)])
        if isinstance(result, BaseException):
            raise result
        return result

    def diarize_many(self, jobs: list[DiarizationJob]) -> list[Diarization | Exception]:
        """SpeakerDiarizer.diarize_many, in the child. Blocking: call it from a worker thread."""
        with self._lock:
            results, self.last_pass = self._child.call(("diarize", jobs))
        return results

    def close(self) -> None:
        """Stops the child (a later call starts a new one)."""
        with self._lock:
            self._child.stop()


def _child_main(conn, setup: tuple, device: str, nice: int) -> None:
    setup_child(setup, PROCESS_NAME)
    lower_process_priority(nice)  # before torch starts its threads: they inherit it

    import torch

    from engine.cpus import available_cpus

    torch.set_num_threads(available_cpus())  # torch's default counts the machine's cores, not a container's quota
    diarizer = SpeakerDiarizer(device, nice)
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message[0] == "stop":
            return
        try:
            if message[0] == "load":
                diarizer.load(message[1])
                reply = ("ok", None)
            else:
                reply = ("ok", (diarizer.diarize_many(message[1]), diarizer.last_pass))
        except Exception as exc:  # noqa: BLE001 - a shared stage's failure: the parent raises it for the pass
            reply = ("error", exc)
        try:
            conn.send(_sendable(reply))
        except OSError:
            return


def _sendable(reply: tuple) -> tuple:
    """The reply, each exception in it that cannot be pickled replaced by a RuntimeError naming it."""
    status, payload = reply
    if status == "error":
        return status, _error(payload)
    if payload is None:
        return reply
    results, stages = payload
    return status, ([_error(r) if isinstance(r, BaseException) else r for r in results], stages)


def _error(exc: BaseException) -> BaseException:
    return exc if picklable(exc) is not None else RuntimeError(repr(exc))
