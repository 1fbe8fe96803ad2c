"""A session's idle timeout (`--realtime-idle-timeout-s`) with one timer per session, not one per event.

asyncio.wait_for around each receive wraps it in a task of its own and a timer: about 8 us of the event loop per
event, and an open microphone sends ten a second, so hundreds of sessions pay it thousands of times a second for
a timeout that almost never fires. Here one timer per session checks, when it fires, whether the session has been
waiting for its next event since a timeout ago; if not, it is set again for when that could be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class IdleWatch:
    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self.waiting_since: float | None = None  # loop time the current receive began; None between receives
        self.timer: asyncio.TimerHandle | None = None
        self.fired = False

    async def receive(self, receive: Callable[[], Awaitable[T]]) -> T:
        """receive()'s result; TimeoutError once it has waited idle_s (the wait is cancelled)."""
        loop = asyncio.get_running_loop()
        self.waiting_since = loop.time()
        if self.timer is None:
            self.timer = loop.call_at(self.waiting_since + self.idle_s, self._check, asyncio.current_task())
        try:
            return await receive()
        except asyncio.CancelledError:
            if not self.fired:
                raise  # the session's own cancellation
            uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python 3.11+: this cancel is handled
            if uncancel is not None:
                uncancel()
            raise TimeoutError from None
        finally:
            self.waiting_since = None

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self, task: asyncio.Task) -> None:
        loop = task.get_loop()
        since = self.waiting_since
        if since is not None and loop.time() >= since + self.idle_s:
            self.timer = None
            self.fired = True
            task.cancel()
        else:  # an event came meanwhile: due a timeout after the current (or the next) wait began
            self.timer = loop.call_at((loop.time() if since is None else since) + self.idle_s, self._check, task)
