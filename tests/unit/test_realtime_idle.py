"""A realtime session's idle timeout (server/realtime/idle.py): one timer per session, however many events."""

from __future__ import annotations

import asyncio

import pytest

from server.realtime.idle import IdleWatch


def test_events_that_keep_coming_never_time_out_and_a_silence_does():
    async def main():
        queue: asyncio.Queue[int] = asyncio.Queue()
        watch = IdleWatch(0.2)

        async def client():
            for i in range(12):  # an event every 50 ms for 0.6 s: three timeouts' worth, never one apart
                await asyncio.sleep(0.05)
                queue.put_nowait(i)

        feeding = asyncio.ensure_future(client())
        got = [await watch.receive(queue.get) for _ in range(12)]
        await feeding
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await watch.receive(queue.get)
        waited = loop.time() - started
        watch.close()
        task = asyncio.current_task()
        if hasattr(task, "cancelling"):  # Python 3.11+: the cancel that ended the wait is not left counted
            assert task.cancelling() == 0
        return got, waited

    got, waited = asyncio.run(main())
    assert got == list(range(12))
    assert 0.19 <= waited < 0.4


def test_the_sessions_own_cancellation_is_not_a_timeout():
    async def main():
        watch = IdleWatch(10.0)
        waiting = asyncio.ensure_future(watch.receive(asyncio.Event().wait))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        watch.close()

    asyncio.run(main())
