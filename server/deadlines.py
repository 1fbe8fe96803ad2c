"""Read deadlines and a per-address connection cap, enforced in uvicorn's httptools protocol (its own config has
neither: a client that sends a request's head or body slowly holds its connection, and its task, for ever).

- **Head**: a request's line and headers arrive within `header_timeout_s` of the connection opening (for a later
  request on a kept-alive connection, of its first byte); else 408 and the connection is closed (without an
  answer when it sent nothing at all).
- **Body**: from the end of the head, after `body_grace_s`, the body arrives at an average of at least
  `body_min_rate_bytes_s` (checked every second). Time the server itself is not reading (its buffer is full because
  the application has not taken the body yet, or a `100 Continue` is not sent yet) does not count. A body that
  falls behind is answered 408 with OpenAI's error envelope, or, when the response has started, its connection is
  closed. A 25 MiB upload at the defaults (8 KiB/s) may take up to ~53 minutes: the rule keeps a connection costly
  to hold (bandwidth, not a byte every ten seconds) without failing slow but honest links.
- **Connections per address**: a connection past `max_connections_per_ip` open from the same peer address is
  answered 429 and closed before anything is read. The peer is the TCP peer: behind a reverse proxy every
  connection is the proxy's, so raise the cap or set it to 0 (none) there.

A WebSocket upgrade leaves this protocol once its head is read: its timers stop and it no longer counts against
its address (realtime sessions have their own cap, --realtime-max-sessions).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import Counter
from dataclasses import dataclass, field

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from .errors import APIError
from .settings import Settings

logger = logging.getLogger(__name__)

BODY_CHECK_INTERVAL_S = 1.0  # how often a body's rate is checked: deadlines are met within a second


@dataclass(frozen=True, slots=True)
class ReadLimits:
    header_timeout_s: float
    body_grace_s: float
    body_min_rate_bytes_s: float  # 0: no minimum
    max_connections_per_ip: int  # 0: no cap


@dataclass(slots=True)
class ConnectionGuard:
    """The limits and the open connections of each peer address, shared by every connection of one server."""

    limits: ReadLimits
    open_by_ip: Counter[str] = field(default_factory=Counter)
    refusing: set[str] = field(default_factory=set)  # addresses at the cap, warned about once each time

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionGuard:
        limits = ReadLimits(
            header_timeout_s=settings.header_timeout_s,
            body_grace_s=settings.body_grace_s,
            body_min_rate_bytes_s=settings.body_min_rate_kib_s * 1024,
            max_connections_per_ip=settings.max_connections_per_ip,
        )
        return cls(limits)

    def admit(self, ip: str) -> bool:
        cap = self.limits.max_connections_per_ip
        if cap and self.open_by_ip[ip] >= cap:
            if ip not in self.refusing:
                self.refusing.add(ip)
                logger.warning("%s has %d connections open (--max-connections-per-ip): refusing more", ip, cap)
            return False
        self.open_by_ip[ip] += 1
        return True

    def release(self, ip: str) -> None:
        self.open_by_ip[ip] -= 1
        if self.open_by_ip[ip] <= 0:
            del self.open_by_ip[ip]
        self.refusing.discard(ip)

    def http_protocol(self) -> functools.partial[GuardedHttpToolsProtocol]:
        """For `uvicorn.Config(http=...)`: uvicorn builds one protocol per connection from it."""
        return functools.partial(GuardedHttpToolsProtocol, guard=self)


def error_response(error: APIError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 response carrying `error`'s envelope, written straight to a transport; it closes."""
    body = json.dumps(error.body()).encode()
    lines = [STATUS_LINE[error.status_code]]
    headers = [*default_headers, *((k.encode(), v.encode()) for k, v in (error.headers or {}).items())]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    lines += [name + b": " + value + b"\r\n" for name, value in headers]
    return b"".join([*lines, b"connection: close\r\n\r\n", body])


def head_timeout() -> APIError:
    return APIError(408, "The request's headers did not arrive in time.", code="request_timeout")


def body_timeout(rate_bytes_s: float) -> APIError:
    return APIError(
        408,
        f"The request body arrived too slowly (below {rate_bytes_s / 1024:g} KiB/s).",
        code="request_timeout",
    )


def too_many_connections(cap: int) -> APIError:
    return APIError(
        429,
        f"Too many connections from this address (at most {cap}).",
        code="too_many_connections",
        headers={"Retry-After": "1"},
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head and body read deadlines and the per-address cap."""

    def __init__(self, *args, guard: ConnectionGuard, **kwargs):
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.limits = guard.limits
        self.counted_ip: str | None = None  # the address this connection counts against, while it does
        self.refused = False
        self.head_started = False  # a byte of the current request has arrived
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_cycle: RequestResponseCycle | None = None
        self.body_bytes = 0
        self.body_clock_start = 0.0  # when the body's rate is measured from, moved on while the server waits
        self.body_last_check = 0.0

    # Connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ip = self.client[0] if self.client else None
        if ip is not None and not self.guard.admit(ip):
            self.refused = True
            refusal = too_many_connections(self.limits.max_connections_per_ip)
            transport.write(error_response(refusal, self.server_state.default_headers))
            transport.close()
            return
        self.counted_ip = ip
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.on_head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_guarding()
        super().connection_lost(exc)

    def stop_guarding(self) -> None:
        self.cancel_head_timer()
        self.cancel_body_timer()
        if self.counted_ip is not None:
            self.guard.release(self.counted_ip)
            self.counted_ip = None

    def data_received(self, data: bytes) -> None:
        if self.refused:  # bytes already in flight when it was refused
            return
        super().data_received(data)

    def handle_websocket_upgrade(self) -> None:
        self.stop_guarding()
        super().handle_websocket_upgrade()

    # Head

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_started = True
        if self.head_timer is None:  # a later request on a kept-alive connection: its first byte starts the clock
            self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self.on_head_timeout)

    def on_headers_complete(self) -> None:
        self.cancel_head_timer()
        self.head_started = False
        super().on_headers_complete()
        if self.parser.should_upgrade() and self._should_upgrade():
            return
        if self.limits.body_min_rate_bytes_s:
            self.start_body_clock()

    def cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def on_head_timeout(self) -> None:
        self.head_timer = None
        if self.transport.is_closing():
            return
        if not self.head_started:  # opened and never used (a pre-connect): close it without an answer
            self.transport.close()
            return
        logger.debug("%s: request head not complete after %.1f s: closed", self.client, self.limits.header_timeout_s)
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined head behind a response still being sent: close once that response is done
            self.cycle.keep_alive = False
            return
        self.transport.write(error_response(head_timeout(), self.server_state.default_headers))
        self.transport.close()

    # Body

    def start_body_clock(self) -> None:
        self.body_cycle = self.cycle
        self.body_bytes = 0
        self.body_clock_start = self.body_last_check = self.loop.time()
        self.body_timer = self.loop.call_later(BODY_CHECK_INTERVAL_S, self.check_body_rate)

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.cancel_body_timer()
        super().on_message_complete()

    def cancel_body_timer(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        self.body_cycle = None

    def check_body_rate(self) -> None:
        cycle, now = self.body_cycle, self.loop.time()
        self.body_timer = None
        if cycle is None or self.transport.is_closing():
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            self.body_clock_start += now - self.body_last_check  # the server is the one not reading
        self.body_last_check = now
        limits = self.limits
        owed = (now - self.body_clock_start - limits.body_grace_s) * limits.body_min_rate_bytes_s
        if self.body_bytes >= owed:
            self.body_timer = self.loop.call_later(BODY_CHECK_INTERVAL_S, self.check_body_rate)
            return
        self.body_cycle = None
        logger.info("%s: request body at %d bytes after %.1f s, too slow: closed", self.client, self.body_bytes,
                    now - self.body_clock_start)  # fmt: skip
        if not cycle.response_started:
            # the application sees a disconnect (its answer goes nowhere); the client gets the 408
            cycle.disconnected = True
            cycle.message_event.set()
            self.log_access(cycle, 408)
            self.transport.write(error_response(body_timeout(limits.body_min_rate_bytes_s), cycle.default_headers))
        self.transport.close()

    def log_access(self, cycle: RequestResponseCycle, status: int) -> None:
        """The access line uvicorn writes when a response starts (this one never passes through it)."""
        if self.access_log:
            scope = cycle.scope
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                    get_path_with_query_string(scope), scope["http_version"], status)  # fmt: skip
