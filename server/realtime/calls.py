"""The server's WebRTC calls in progress, by id: the POST that opened one has been answered, so its session runs as
a task of its own, until the call ends, the client hangs up (POST /v1/realtime/calls/{id}/hangup), or the server
stops. With several front-ends (--api-servers) the hangup may reach another one than the call's: a directory that
the first front-end keeps (shared_state.py) passes it on, and the call's front-end collects it within HANGUP_POLL_S.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from .webrtc import Call

HANGUP_POLL_S = 0.25


class Calls:
    def __init__(self, directory=None, front_end: int = 0) -> None:
        """`directory`: the front-ends' shared CallDirectory (or its proxy) when there are several; `front_end`:
        this one's index."""
        self.calls: dict[str, Call] = {}
        self.tasks: set[asyncio.Task] = set()
        self.directory, self.front_end = directory, front_end
        self._collecting: asyncio.Task | None = None

    def start(self, call: Call, session: Awaitable[None]) -> None:
        """Run `session` (the call's Connection) until it ends; the peer connection is closed then."""
        self.calls[call.id] = call
        if self.directory is not None:
            self.directory.add(call.id, self.front_end)
            if self._collecting is None or self._collecting.done():
                self._collecting = asyncio.ensure_future(self._collect_hangups())

        async def run() -> None:
            try:
                await session
            finally:
                self.calls.pop(call.id, None)
                if self.directory is not None:
                    with contextlib.suppress(Exception):  # the first front-end is gone: nothing to tell
                        await asyncio.to_thread(self.directory.remove, call.id)
                await call.close()

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def hangup(self, call_id: str) -> bool:
        """End the call; False if there is none of that id (on any front-end)."""
        call = self.calls.get(call_id)
        if call is None:
            return self.directory is not None and await asyncio.to_thread(self.directory.hang_up, call_id)
        await call.close()
        return True

    async def _collect_hangups(self) -> None:
        """While this front-end holds calls: end those whose hangup reached another front-end."""
        while self.calls:
            await asyncio.sleep(HANGUP_POLL_S)
            with contextlib.suppress(Exception):
                for call_id in await asyncio.to_thread(self.directory.hangups, self.front_end):
                    if (call := self.calls.get(call_id)) is not None:
                        await call.close()

    async def close_all(self) -> None:
        for call in list(self.calls.values()):
            await call.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)
