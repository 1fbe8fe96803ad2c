"""EnginePool's failover: a request whose engine died before any of it ran goes to another live engine, unseen by
its caller; one that had started fails with the engine (it may be what killed it)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine import EngineDeadError
from engine.processes.pool import EnginePool
from engine.request import DecodeOptions
from tests.helpers.fake_engine import FakeEngine


def pool_of(*engines: FakeEngine) -> EnginePool:
    pool = EnginePool(len(engines))
    for i, engine in enumerate(engines):
        engine.load = i  # the first is the least loaded: it gets the request
        pool.set(i, engine)
    return pool


def test_an_unstarted_request_of_a_dead_engine_goes_to_another():
    dying, alive = FakeEngine(result_error=EngineDeadError("killed", unstarted=True)), FakeEngine()
    handle = pool_of(dying, alive).submit(np.zeros(16000, dtype=np.float32), DecodeOptions())
    dying.alive = False  # it dies with the request queued
    result = asyncio.run(handle.result())
    assert result.text and len(dying.handles) == len(alive.handles) == 1
    dying, alive = FakeEngine(result_error=EngineDeadError("killed", unstarted=True)), FakeEngine()
    assert len(asyncio.run(_events(pool_of(dying, alive), dying))) == 1  # the stream of the engine that served it


async def _events(pool: EnginePool, dying: FakeEngine) -> list:
    handle = pool.submit(np.zeros(16000, dtype=np.float32), DecodeOptions())
    dying.alive = False
    return [e async for e in handle.events()]


def test_a_started_request_fails_with_its_engine():
    dying, alive = FakeEngine(result_error=EngineDeadError("killed")), FakeEngine()
    handle = pool_of(dying, alive).submit(np.zeros(16000, dtype=np.float32), DecodeOptions())
    with pytest.raises(EngineDeadError):
        asyncio.run(handle.result())
    assert not alive.handles


def test_a_request_moves_at_most_once_per_other_engine():
    # engines that keep failing their requests before starting them (yet report themselves alive)
    dead = [FakeEngine(result_error=EngineDeadError("killed", unstarted=True)) for _ in range(3)]
    handle = pool_of(*dead).submit(np.zeros(16000, dtype=np.float32), DecodeOptions())
    with pytest.raises(EngineDeadError):
        asyncio.run(handle.result())
    assert sum(len(e.handles) for e in dead) == 3  # tried on each engine once


def test_a_moved_request_never_goes_back_to_the_engine_that_failed_it():
    # a killed engine process looks alive until it is reaped, and the least loaded once its requests are failed
    dying, alive = FakeEngine(result_error=EngineDeadError("killed", unstarted=True)), FakeEngine()
    handle = pool_of(dying, alive).submit(np.zeros(16000, dtype=np.float32), DecodeOptions())
    result = asyncio.run(handle.result())
    assert result.text and len(dying.handles) == len(alive.handles) == 1
