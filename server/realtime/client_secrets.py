"""Ephemeral client secrets (`POST /v1/realtime/client_secrets`): what an app's backend mints with its API key and
hands to a browser or phone, so that the key itself never reaches the device.

A secret (`ek_...`) opens one realtime connection, once, before it expires (OpenAI's default 600 s, 10 to 7,200):
the key check (server/auth.py) redeems it, and the session starts with the configuration the secret was minted
with (the client may change it with session.update, as on OpenAI). It is good for nothing else: the HTTP routes
take API keys only. OpenAI lets one secret open several sessions until it expires; here a second use is refused,
so a secret read from a device's traffic or logs after its session started opens nothing.

Secrets live in the server's memory only (with several front-ends, the first's: shared_state.py), stored by their SHA-256 (a memory dump shows no usable secret): a
restart invalidates them all, as it should. At most `max_outstanding` are unexpired at once; minting past that
is refused (429) rather than letting a client grow the table without bound.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PREFIX = "ek_"
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 10, 7200, 600  # OpenAI's bounds on expires_after.seconds, and its default


@dataclass(frozen=True)
class ClientSecret:
    expires_at: int  # seconds since the epoch
    session: dict | None  # the transcription session configuration it was minted with (validated), if any


class ClientSecrets:
    """The unexpired secrets of this process: mint() one, redeem() it once."""

    def __init__(self, max_outstanding: int, clock: Callable[[], float] = time.time) -> None:
        self.max_outstanding = max_outstanding
        self.clock = clock
        self._by_digest: dict[bytes, ClientSecret] = {}
        self._lock = threading.Lock()  # the other front-ends' calls come from threads (shared_state.py)

    def __len__(self) -> int:
        return len(self._by_digest)

    def mint(self, ttl_s: int, session: dict | None) -> tuple[str, ClientSecret] | None:
        """A new secret's value and record, valid for `ttl_s` seconds; None while max_outstanding are unexpired."""
        with self._lock:
            return self._mint(ttl_s, session)

    def _mint(self, ttl_s: int, session: dict | None) -> tuple[str, ClientSecret] | None:
        self._drop_expired()
        if len(self._by_digest) >= self.max_outstanding:
            return None
        value = PREFIX + secrets.token_urlsafe(32)
        secret = ClientSecret(int(self.clock()) + ttl_s, session)
        self._by_digest[_digest(value)] = secret
        return value, secret

    def redeem(self, value: str) -> ClientSecret | None:
        """The secret `value` names, used up by this call; None if it is unknown, used or expired."""
        with self._lock:
            secret = self._by_digest.pop(_digest(value), None)
        if secret is None or secret.expires_at <= self.clock():
            return None
        return secret

    def _drop_expired(self) -> None:
        now = self.clock()
        for digest in [d for d, s in self._by_digest.items() if s.expires_at <= now]:
            del self._by_digest[digest]


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
