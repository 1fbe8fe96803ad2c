"""The server's WebRTC calls in progress, by id: the POST that opened one has been answered, so its session runs as
a task of its own, until the call ends, the client hangs up (POST /v1/realtime/calls/{id}/hangup), or the server
stops."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from .webrtc import Call


class Calls:
    def __init__(self) -> None:
        self.calls: dict[str, Call] = {}
        self.tasks: set[asyncio.Task] = set()

    def start(self, call: Call, session: Awaitable[None]) -> None:
        """Run `session` (the call's Connection) until it ends; the peer connection is closed then."""
        self.calls[call.id] = call

        async def run() -> None:
            try:
                await session
            finally:
                self.calls.pop(call.id, None)
                await call.close()

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def hangup(self, call_id: str) -> bool:
        """End the call; False if there is none of that id."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        await call.close()
        return True

    async def close_all(self) -> None:
        for call in list(self.calls.values()):
            await call.close()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5)
