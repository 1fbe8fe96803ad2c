"""EngineSupervisor: starts the engine, restarts it when it dies, and drains it on shutdown.

A dead engine (its process killed, its loop crashed) fails only the requests it held; the supervisor notices within
a poll, starts a new one with back-off between attempts, and /health turns 200 again once it is up. After
`max_restarts` failed starts in a row it gives up and /health stays 503 (an orchestrator then replaces the server).
Data parallel engines (engine/processes/pool.py) have a supervisor each, which puts its engine in the pool's slot: the
others serve meanwhile, and /health stays 200 while any is up.

In a further front-end process (--api-servers) the supervisor starts nothing: it connects to the engine process the
first front-end runs (an EngineClient), and when that connection ends (the engine died, and the first front-end's
supervisor restarts it at the same address) it connects again, every RECONNECT_S, for as long as it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from engine import EngineClient, EngineConfig, EngineLike, start_engine

from .metrics import Metrics

logger = logging.getLogger(__name__)

POLL_S = 0.5
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A restarted engine that stays up this long is healthy again: the next death starts the back-off anew.
STABLE_S = 60.0
RECONNECT_S = 0.5


class EngineSupervisor:
    def __init__(
        self,
        config: EngineConfig,
        own_process: bool,
        metrics: Metrics,
        publish: Callable[[EngineLike | None], None],
        max_restarts: int,
        gpu: int | None = None,
        name: str = "the engine",
        listen: tuple[str, bytes] | None = None,
        connect: tuple[str, bytes] | None = None,
    ):
        """`listen`: the address (a Unix socket's path, a key) its engine process takes other front-ends' clients
        at; `connect`: connect to the engine process at that address instead of starting one."""
        self.config = config
        self.listen, self.connect = listen, connect
        self.gpu = gpu  # the one GPU its process sees (data parallel)
        self.name = name  # in log lines: "the engine", or "engine 1" of several
        self.own_process = own_process
        self.metrics = metrics
        self.publish = publish  # where requests find the engine (its ServedModel); None while there is none
        self.max_restarts = max_restarts
        self.engine: EngineLike | None = None
        self.stopping = False
        self._task: asyncio.Task | None = None

    async def start(self) -> EngineLike:
        """Load and start the first engine (a failure here is the server's start-up failure)."""
        self.engine = await self._load()
        self.publish(self.engine)
        self._task = asyncio.create_task(self._watch(), name="engine-supervisor")
        return self.engine

    async def _load(self) -> EngineLike:
        if self.connect is not None:
            client = await asyncio.to_thread(EngineClient, self.config, self.connect)
            client.start()
            return client
        # Loading weights takes seconds; off the event loop so that the server stays responsive.
        return await asyncio.to_thread(start_engine, self.config, self.own_process, self.gpu, self.listen)

    async def _watch(self) -> None:
        failures = 0  # restarts since the engine was last up for STABLE_S
        up_since = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(POLL_S)
            if self.stopping or self.engine is None or self.engine.is_alive:
                continue
            if time.monotonic() - up_since > STABLE_S:
                failures = 0
            self.publish(None)
            dead, self.engine = self.engine, None
            await asyncio.to_thread(dead.shutdown)
            if self.connect is not None:
                logger.warning("%s: lost the engine (%s); connecting again", self.name, dead.failure or "closed")
                engine = await self._reconnect()
                if engine is None:
                    return
                self.engine = engine
                self.publish(engine)
                logger.info("%s: connected to the engine again", self.name)
                continue
            logger.error("%s stopped (%s); restarting it", self.name, dead.failure or "no reason given")
            engine = None
            while engine is None and failures < self.max_restarts and not self.stopping:
                await asyncio.sleep(0.0 if failures == 0 else min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (failures - 1)))
                failures += 1
                self.metrics.engine_restarts.inc()
                try:
                    engine = await self._load()
                except Exception:
                    logger.exception("%s: restart %d of %d failed", self.name, failures, self.max_restarts)
            if engine is None:
                if not self.stopping:
                    logger.error("%s failed %d restarts in a row; giving up", self.name, failures)
                return
            if self.stopping:
                await asyncio.to_thread(engine.shutdown)
                return
            self.engine = engine
            self.publish(engine)
            up_since = time.monotonic()
            pid = getattr(engine, "pid", None)
            logger.info(
                "%s restarted (restart %d of at most %d in a row)%s",
                self.name, failures, self.max_restarts, f"; engine in process {pid}" if pid else "",
            )  # fmt: skip

    async def _reconnect(self) -> EngineLike | None:
        """A new connection to the engine process at `connect`, once one answers there; None if stopped first."""
        while not self.stopping:
            await asyncio.sleep(RECONNECT_S)
            try:
                engine = await self._load()
            except (OSError, EOFError):  # nothing listens there yet: the engine is restarting
                continue
            if self.stopping:
                await asyncio.to_thread(engine.shutdown)
                return None
            return engine
        return None

    async def shutdown(self) -> None:
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
        self.publish(None)
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await asyncio.to_thread(engine.shutdown)
