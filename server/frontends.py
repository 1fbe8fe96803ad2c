"""Several HTTP front-end processes on one port, sharing the engines (--api-servers N).

One process's event loop hears a few thousand realtime appends a second (each is a WebSocket frame, JSON, base64,
resampling and a VAD pass), so a thousand open microphones need several. The first front-end, the process
`whisper-server serve` starts, binds the port, starts each engine in a process of its own listening on a Unix socket
(engine/processes/engine_process.py: a path in a private folder, a random key), and hosts the state the front-ends
share (shared_state.py: client secrets, which front-end holds which WebRTC call). Once its engines are up it starts
N-1 further front-ends, each a process with its own event loop on the same listening socket (the kernel hands each
new connection to one of them), its own VAD, and an EngineClient per engine, which batches its requests with
everyone else's there. It restarts a front-end that dies, and stops them with itself.

/metrics sums every front-end's series (prometheus_client's multiprocess mode: each process writes its values to a
file in the private folder); the engine's series are what the answering front-end read from it last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from .settings import Settings

logger = logging.getLogger(__name__)

WATCH_S = 1.0
STOP_TIMEOUT_S = 5.0  # past the drain, which a front-end finishes first
START_TIMEOUT_S = 600.0
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class FrontEndPlan:
    """Where the front-ends of one server meet: the private folder of their sockets, the key every connection
    proves, how many front-ends there are and which one this is (0: the first, which owns the engines)."""

    folder: str
    key: bytes
    count: int
    index: int = 0

    @classmethod
    def create(cls, count: int) -> FrontEndPlan:
        import secrets

        folder = tempfile.mkdtemp(prefix="whisper-server-")  # mode 0700: no other user reaches the sockets
        return cls(folder, secrets.token_bytes(32), count)

    @property
    def first(self) -> bool:
        return self.index == 0

    def address(self, name: str) -> tuple[str, bytes]:
        return os.path.join(self.folder, f"{name}.sock"), self.key

    def engine(self, model: int, member: int = 0) -> tuple[str, bytes]:
        """Where the engine process of served model `model` (its data parallel engine `member`) takes clients."""
        return self.address(f"engine-{model}-{member}")

    def share(self, total: int) -> int:
        """A front-end's share of a server-wide bound (waiting requests, partial decodes in flight)."""
        return math.ceil(total / self.count) if total else 0

    def front_end_settings(self, settings: Settings) -> Settings:
        """The settings one front-end goes by: its share of the server's realtime bounds (sessions open, audio held
        uncommitted), which it counts alone (the partial decodes in flight and the requests waiting for an engine:
        app.py and served_models.py)."""
        if self.count == 1:
            return settings
        return settings.model_copy(update={
            "realtime_max_sessions": self.share(settings.realtime_max_sessions),
            "realtime_max_buffered_seconds_total": settings.realtime_max_buffered_seconds_total / self.count,
        })  # fmt: skip

    @property
    def metrics_folder(self) -> str:
        return os.path.join(self.folder, "metrics")

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def use_multiprocess_metrics(plan: FrontEndPlan) -> None:
    """Before prometheus_client is first imported (it reads this once): each process writes its series to files
    there, which /metrics sums. The further front-ends inherit it."""
    os.makedirs(plan.metrics_folder, exist_ok=True)
    os.environ[METRICS_ENV] = plan.metrics_folder


class FrontEnds:
    """The first front-end's view of the others: started once its engines are up, restarted when one dies, asked
    to drain when the server is, and stopped with it."""

    def __init__(self, settings: Settings, plan: FrontEndPlan, sockets: list[socket.socket], target: Callable):
        """`target(settings, plan, sockets, ready)`: a further front-end's main (serving.front_end_main), which sets
        the event `ready` once it serves."""
        self.settings, self.plan, self.sockets, self.target = settings, plan, sockets, target
        self.processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self.ready: dict[int, object] = {}
        self.stopping = False
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        """Start the others and wait until each serves (or has failed to start), so that this one, which accepts
        connections only after this, does not take the first burst of them alone."""
        ready = [self._spawn(index) for index in range(1, self.plan.count)]
        deadline = time.monotonic() + START_TIMEOUT_S
        for (index, process), event in zip(self.processes.items(), ready):
            while not await asyncio.to_thread(event.wait, WATCH_S):
                if not process.is_alive() or time.monotonic() > deadline:
                    logger.error("front-end %d (process %s) did not start", index, process.pid)
                    break
        self._watch = asyncio.ensure_future(self._watch_forever())
        logger.info("%d front-end processes share the port: %s and this one (%d)", self.plan.count,
                    ", ".join(str(p.pid) for p in self.processes.values()), os.getpid())  # fmt: skip

    def _spawn(self, index: int):
        """Start front-end `index`; the event it sets once it serves."""
        ctx = multiprocessing.get_context("spawn")  # the socket crosses as a duplicated descriptor
        ready = ctx.Event()
        plan = FrontEndPlan(self.plan.folder, self.plan.key, self.plan.count, index)
        process = ctx.Process(target=self.target, name=f"whisper-front-end-{index}",
                              args=(self.settings, plan, self.sockets, ready))  # fmt: skip
        process.start()
        self.processes[index] = process
        self.ready[index] = ready  # kept: the child opens it by name as it starts
        return ready

    async def _watch_forever(self) -> None:
        while not self.stopping:
            await asyncio.sleep(WATCH_S)
            for index, process in list(self.processes.items()):
                if process.is_alive() or self.stopping:
                    continue
                logger.error("front-end %d (process %s) exited with code %s; starting it again", index, process.pid,
                             process.exitcode)  # fmt: skip
                _forget_metrics(process.pid)
                self._spawn(index)

    def pass_stop(self, sig: int = signal.SIGTERM) -> None:
        """Pass the server's stop on: each front-end drains its own requests meanwhile. Always as SIGTERM: a Ctrl-C
        already reached them from the terminal, and a second SIGINT would make uvicorn stop without draining."""
        self.stopping = True
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signal.SIGTERM)

    async def stop(self) -> None:
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        self.pass_stop()
        deadline = time.monotonic() + self.settings.drain_timeout_s + STOP_TIMEOUT_S
        for process in self.processes.values():
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5)


def _forget_metrics(pid: int | None) -> None:
    """A gone process's live gauges (sessions open, diarizations pending) stop counting."""
    if pid is not None and os.environ.get(METRICS_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
