"""EnginePool: data parallel engines (one per GPU, or a CPU's cores split between them) behind one engine's interface.

Each request goes to the live engine with the least load, the 30 s windows of its requests in flight (sent and
not finished: waiting or decoding, EngineProcess.load), ties to the engine after the last one chosen; a request's
handle, and so its stream, its abort and a realtime turn, stays with that engine. An engine that dies fails only
the requests it had started: one whose first window had not reached a slot goes to another live engine, unseen by
its caller (FailoverHandle). The dead engine's slot is empty (None) until its supervisor (server/supervisor.py)
puts a new one there, and requests go to the others meanwhile. The engines serve one model with one configuration, so what callers ask
of the model (its name, tokenizer, context, slots) is the first live engine's.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading

import numpy as np

from engine.frontend import Handle
from engine.request import DecodeOptions, EngineDeadError, EngineError, EngineOverloadedError, EngineStats


class EnginePool:
    def __init__(self, size: int):
        self.engines: list = [None] * size
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def set(self, index: int, engine) -> None:
        """Engine `index` is now `engine` (None: it is down)."""
        self.engines[index] = engine

    def live(self) -> list[tuple[int, object]]:
        return [(i, e) for i, e in enumerate(self.engines) if e is not None and e.is_alive]

    def _first(self):
        engines = [e for _, e in self.live()] or [e for e in self.engines if e is not None]
        if not engines:
            raise EngineDeadError("no engine is running")
        return engines[0]

    # ---- the engine's interface -----------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._first().model_name

    @property
    def is_multilingual(self) -> bool:
        return self._first().is_multilingual

    @property
    def tokenizer(self):
        return self._first().tokenizer

    @property
    def n_text_ctx(self) -> int:
        return self._first().n_text_ctx

    @property
    def num_slots(self) -> int:
        return self._first().num_slots

    @property
    def config(self):
        return self._first().config

    @property
    def is_alive(self) -> bool:
        return bool(self.live())

    @property
    def failure(self) -> str | None:
        if self.is_alive:
            return None
        reasons = [e.failure for e in self.engines if e is not None and e.failure]
        return "; ".join(reasons) or "no engine is running"

    def start(self) -> None:
        """The engines are started by their supervisors."""

    def submit(self, audio: np.ndarray, options: DecodeOptions) -> Handle:
        """To the least loaded live engine; if it turns out dead or full, to the next."""
        engine, handle = self.place(audio, options, avoid=())
        return FailoverHandle(self, audio, options, engine, handle)

    def place(self, audio: np.ndarray, options: DecodeOptions, avoid) -> tuple[object, Handle]:
        """(engine, handle) of the least loaded live engine not in `avoid` that takes the request (EngineDeadError
        when none is live)."""
        with self._lock:
            turn = next(self._turn)
        live = [(i, e) for i, e in self.live() if not any(e is a for a in avoid)]
        if not live:
            raise EngineDeadError("no engine is running")
        # least load first; among equals, the one after the engine chosen last (round robin when idle)
        order = sorted(live, key=lambda item: (item[1].load, (item[0] - turn) % len(self.engines)))
        error: EngineError | None = None
        for _, engine in order:
            try:
                return engine, engine.submit(audio, options)
            except (EngineDeadError, EngineOverloadedError) as exc:  # died or full since: the next one
                error = exc
        assert error is not None
        raise error

    def abort(self, request_id: str) -> None:
        """Handles abort on their own engine (request ids are each engine's own)."""
        raise NotImplementedError("abort through the request's handle")

    @property
    def adapter_names(self) -> frozenset[str]:
        return self._first().adapter_names

    def change_adapter(self, name: str, folder: str | None) -> None:
        """On every engine of the pool (one that is down loads the config's adapters when it restarts)."""
        for _, engine in self.live():
            engine.change_adapter(name, folder)

    def stats(self) -> EngineStats:
        """The live engines' stats summed (their totals too); batch-invariant if all of them are."""
        stats = self.total([s for _, s in self.member_stats() if s is not None])
        if stats is None:
            raise EngineDeadError("no engine is running")
        return stats

    @staticmethod
    def total(each: list[EngineStats]) -> EngineStats | None:
        """Several engines' stats summed; None for none."""
        if not each:
            return None
        extra: dict[str, float] = {}
        for s in each:
            for name, value in s.extra.items():
                extra[name] = extra.get(name, 0.0) + value
        return EngineStats(
            num_waiting=sum(s.num_waiting for s in each),
            num_running=sum(s.num_running for s in each),
            num_slots=sum(s.num_slots for s in each),
            batch_invariant=all(s.batch_invariant for s in each),
            extra=extra,
        )

    def member_stats(self) -> list[tuple[int, EngineStats | None]]:
        """Each engine's stats (None for one that is down or does not answer)."""
        out = []
        for i, engine in enumerate(self.engines):
            stats = None
            if engine is not None and engine.is_alive:
                try:
                    stats = dataclasses.replace(engine.stats())
                except EngineError:
                    stats = None
            out.append((i, stats))
        return out

    def shutdown(self) -> None:
        for engine in self.engines:
            if engine is not None:
                engine.shutdown()


class FailoverHandle:
    """A pool request's handle: while nothing of the request has run, the death of its engine sends it to another
    live engine (each engine of the pool at most once: a dying engine can look alive for a moment, and least
    loaded once its requests are failed) instead of failing it; its caller sees one request."""

    def __init__(self, pool: EnginePool, audio: np.ndarray, options: DecodeOptions, engine, handle: Handle):
        self.pool, self.audio, self.options, self.handle = pool, audio, options, handle
        self.tried = [engine]

    @property
    def request_id(self) -> str:
        return self.handle.request_id

    def _move(self, exc: EngineDeadError) -> None:
        if not exc.unstarted:
            raise exc
        try:
            engine, self.handle = self.pool.place(self.audio, self.options, avoid=self.tried)
        except EngineDeadError:
            raise exc from None
        self.tried.append(engine)

    async def events(self):
        while True:
            try:
                async for event in self.handle.events():
                    yield event
                return
            except EngineDeadError as exc:
                self._move(exc)  # an unstarted request has sent no event yet

    async def result(self):
        async for _ in self.events():
            pass
        return await self.handle.result()

    def abort(self) -> None:
        self.handle.abort()
