"""What the front-ends of one server share (--api-servers, frontends.py): the realtime client secrets, which any
front-end may mint and any may redeem once, and which front-end holds each WebRTC call, so that a hangup reaching
another one ends it.

A process of their own holds both (multiprocessing's managers: started by the first front-end, a thread per
connection, served over a Unix socket in the front-ends' private folder), so that a busy front-end delays no
other's redemption; each front-end holds proxies with the same methods, each call a round trip.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.managers import BaseManager

from .realtime.client_secrets import ClientSecrets


class CallDirectory:
    """Which front-end holds each WebRTC call in progress, and the hangups asked of a front-end's calls elsewhere
    (it collects them every few hundred milliseconds while it holds calls: realtime/calls.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[str, int] = {}
        self._hangups: dict[int, set[str]] = {}

    def add(self, call_id: str, front_end: int) -> None:
        with self._lock:
            self._holders[call_id] = front_end

    def remove(self, call_id: str) -> None:
        with self._lock:
            front_end = self._holders.pop(call_id, None)
            if front_end is not None:
                self._hangups.get(front_end, set()).discard(call_id)

    def hang_up(self, call_id: str) -> bool:
        """Ask the call's front-end to end it; False if no front-end holds a call of that id."""
        with self._lock:
            front_end = self._holders.get(call_id)
            if front_end is None:
                return False
            self._hangups.setdefault(front_end, set()).add(call_id)
            return True

    def hangups(self, front_end: int) -> list[str]:
        """The calls of `front_end` that another front-end was asked to end since it last looked."""
        with self._lock:
            return sorted(self._hangups.pop(front_end, set()))


class _Host(BaseManager):
    pass


class _Guest(BaseManager):
    pass


_secrets: ClientSecrets | None = None
_calls: CallDirectory | None = None


def _shared_secrets(max_outstanding: int) -> ClientSecrets:
    global _secrets
    if _secrets is None:
        _secrets = ClientSecrets(max_outstanding)
    return _secrets


def _shared_calls() -> CallDirectory:
    global _calls
    if _calls is None:
        _calls = CallDirectory()
    return _calls


def _watch_parent(parent: int) -> None:
    """In the state's process: it ends with the first front-end, however that ends (a SIGKILL included)."""
    from .frontends import WATCH_S

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the first front-end stops it
    threading.Thread(target=watch, name="state-parent", daemon=True).start()


_Host.register("secrets", callable=_shared_secrets)
_Host.register("calls", callable=_shared_calls)
_Guest.register("secrets")
_Guest.register("calls")


def host(address: tuple[str, bytes], max_outstanding: int) -> tuple[BaseManager, ClientSecrets, CallDirectory]:
    """Start the process that keeps the shared state at `address`; it and proxies of its secrets and calls."""
    path, key = address
    manager = _Host(address=path, authkey=key, ctx=multiprocessing.get_context("spawn"))
    manager.start(_watch_parent, (os.getpid(),))
    return manager, manager.secrets(max_outstanding), manager.calls()  # type: ignore[attr-defined]


def connect(address: tuple[str, bytes], max_outstanding: int) -> tuple[ClientSecrets, CallDirectory]:
    """Proxies of the shared secrets and call directory (each method a round trip to the state's process)."""
    path, key = address
    manager = _Guest(address=path, authkey=key)
    manager.connect()
    return manager.secrets(max_outstanding), manager.calls()  # type: ignore[attr-defined]
