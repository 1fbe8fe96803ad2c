"""Drain: readiness off at once, requests in flight aborted when the timeout passes, and only those."""

from __future__ import annotations

import asyncio

from server.drain import Drain


class StubHandle:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_the_timeout_aborts_what_is_still_in_flight():
    async def body():
        drain = Drain(timeout_s=0.05)
        finished, running = StubHandle(), StubHandle()
        drain.track(finished)
        drain.track(running)
        drain.untrack(finished)
        drain.begin(asyncio.get_running_loop())
        assert drain.draining and not drain.expired
        await asyncio.sleep(0.01)
        assert not running.aborted  # within the timeout requests may still finish
        await asyncio.sleep(0.1)
        assert drain.expired and running.aborted and not finished.aborted

    asyncio.run(body())


def test_a_second_signal_does_not_restart_the_timer():
    async def body():
        drain = Drain(timeout_s=0.05)
        loop = asyncio.get_running_loop()
        drain.begin(loop)
        await asyncio.sleep(0.03)
        drain.begin(loop)
        await asyncio.sleep(0.04)
        assert drain.expired

    asyncio.run(body())
