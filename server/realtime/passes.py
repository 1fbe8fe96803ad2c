"""Work from every live session run together, one worker-thread pass at a time, beside the event loop.

An open microphone appends 100 ms of audio ten times a second. Work done for each append on the event loop holds
every other event of every session (and /health) behind it, and work with a fixed cost per call (Silero's is about
a millisecond) caps a server at a few dozen microphones when it runs once per append. A WorkerPasses takes one
item from a session at a time; the items that arrive while one pass runs wait for the next, which runs all of them
in a worker thread: the loop only hands them over, and the more sessions, the bigger a pass. A session has one item
in flight at a time (its next waits for this one's result), so its own work stays in order; what it has to hear
meanwhile goes into its next item (connection.py, the appends heard by a task of their own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class WorkerPasses(Generic[Item, Result]):
    """run_pass(items) runs in a worker thread and returns each item's result, or the Exception that item raised
    (its session's own error); an exception out of run_pass itself is every item's."""

    def __init__(self, run_pass: Callable[[list[Item]], list[Result | Exception]]):
        self.run_pass = run_pass
        self.pending: list[tuple[Item, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.worker: asyncio.Task | None = None

    async def run(self, item: Item) -> Result:
        """The item's result from the next pass (or what it raised)."""
        if self.worker is None or self.worker.done():
            self.wake = asyncio.Event()
            self.worker = asyncio.ensure_future(self._run())
        future = asyncio.get_running_loop().create_future()
        self.pending.append((item, future))
        self.wake.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            batch, self.pending = self.pending, []
            if not batch:
                continue
            try:
                outcomes = await asyncio.to_thread(self.run_pass, [item for item, _ in batch])
            except Exception as exc:  # noqa: BLE001 - handed to every session of the pass
                outcomes = [exc] * len(batch)
            for (_, future), outcome in zip(batch, outcomes):
                if future.done():  # a session that went away cancelled its wait
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
