"""EngineSupervisor: a dead engine is replaced, restarts back off and stop after max_restarts in a row."""

from __future__ import annotations

import asyncio

import pytest

import server.supervisor as supervisor_module
from engine import EngineConfig
from server.metrics import Metrics
from server.supervisor import EngineSupervisor


class StubEngine:
    """Only what the supervisor reads: is_alive, failure, shutdown."""

    def __init__(self) -> None:
        self.is_alive = True
        self.failure: str | None = None
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    monkeypatch.setattr(supervisor_module, "FIRST_BACKOFF_S", 0.01)


def run_supervisor(monkeypatch, starts, max_restarts: int, scenario):
    """Runs `scenario(supervisor, published)` against engines produced by `starts` (each a StubEngine or an
    exception to raise)."""
    queue = list(starts)

    def start_engine(config, own_process, gpu=None, listen=None):
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    monkeypatch.setattr(supervisor_module, "start_engine", start_engine)
    metrics = Metrics()
    published: list = []

    async def body():
        sup = EngineSupervisor(EngineConfig(), False, metrics, published.append, max_restarts)
        await sup.start()
        try:
            await scenario(sup, published)
        finally:
            await sup.shutdown()

    asyncio.run(body())
    return metrics.engine_restarts._value.get(), published


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_a_dead_engine_is_replaced(monkeypatch, fast):
    first, second = StubEngine(), StubEngine()

    async def scenario(sup, published):
        first.is_alive = False
        await wait_until(lambda: sup.engine is second)
        assert first.shut_down and published[-1] is second and None in published

    restarts, _ = run_supervisor(monkeypatch, [first, second], 3, scenario)
    assert restarts == 1


def test_failed_restarts_back_off_and_stop_after_max(monkeypatch, fast):
    first = StubEngine()

    async def scenario(sup, published):
        first.is_alive = False
        await wait_until(lambda: sup._task.done())
        assert sup.engine is None and published[-1] is None  # given up: /health stays 503

    restarts, _ = run_supervisor(monkeypatch, [first] + [RuntimeError("no GPU")] * 3, 3, scenario)
    assert restarts == 3


def test_a_failed_restart_is_retried(monkeypatch, fast):
    first, third = StubEngine(), StubEngine()

    async def scenario(sup, published):
        first.is_alive = False
        await wait_until(lambda: sup.engine is third)

    restarts, _ = run_supervisor(monkeypatch, [first, RuntimeError("busy"), third], 3, scenario)
    assert restarts == 2
