"""Draining on SIGTERM: readiness turns false at once, requests in flight get `drain_timeout_s` to finish, and
whatever is still running then is aborted so that its client gets a clean 503 before the server exits."""

from __future__ import annotations

import asyncio
import functools
import logging
from types import FrameType

import uvicorn

from engine import RequestHandle

from .deadlines import ConnectionGuard, GuardedHttpToolsProtocol
from .errors import APIError
from .settings import Settings

logger = logging.getLogger(__name__)

# Seconds after the drain timeout for the aborted requests' 503s to be written before uvicorn cancels them.
DRAIN_FLUSH_S = 1.0


def shutting_down() -> APIError:
    return APIError(
        503,
        "The server is shutting down; retry the request.",
        code="server_shutting_down",
        headers={"Connection": "close", "Retry-After": "1"},
    )


class Drain:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.draining = False
        self.expired = False
        self.handles: set[RequestHandle] = set()  # requests waiting on the engine

    def track(self, handle: RequestHandle) -> RequestHandle:
        self.handles.add(handle)
        return handle

    def untrack(self, handle: RequestHandle) -> None:
        self.handles.discard(handle)

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called from the signal handler (the event loop's thread)."""
        if self.draining:
            return
        self.draining = True
        logger.info("draining: %d requests in flight, %.1f s to finish", len(self.handles), self.timeout_s)
        loop.call_later(self.timeout_s, self.expire)

    def expire(self) -> None:
        self.expired = True
        if self.handles:
            logger.warning("drain timeout: aborting %d requests still in flight", len(self.handles))
        for handle in list(self.handles):
            handle.abort()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, which tells the drain of the first SIGTERM/SIGINT at once: readiness turns false and the
    drain timer starts, while uvicorn stops accepting connections and waits for the running requests."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        self.on_exit: list = []  # called with the signal first (the further front-ends are told: frontends.py)

    @staticmethod
    def http_protocol(settings: Settings) -> functools.partial[GuardedHttpToolsProtocol]:
        """For `uvicorn.Config(http=...)`: httptools with the read deadlines and per-address cap (deadlines.py)."""
        return ConnectionGuard.from_settings(settings).http_protocol()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        for hook in self.on_exit:
            hook(sig)
        try:
            self.drain.begin(asyncio.get_running_loop())
        except RuntimeError:  # no event loop yet (still starting): nothing to drain
            pass
        super().handle_exit(sig, frame)
