"""The realtime client secrets' store (server/realtime/client_secrets.py): one use each, until expiry, bounded, and
kept only as digests."""

from __future__ import annotations

from server.realtime.client_secrets import PREFIX, ClientSecrets


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_secret_is_redeemed_once_before_it_expires_and_never_after():
    clock = Clock()
    store = ClientSecrets(10, clock)
    value, secret = store.mint(60, {"type": "transcription"})
    assert value.startswith(PREFIX) and secret.expires_at == 1_000_060
    assert store.redeem(value) == secret
    assert store.redeem(value) is None  # used
    late, _ = store.mint(60, None)
    clock.now += 60
    assert store.redeem(late) is None  # expired at expires_at
    assert store.redeem(PREFIX + "forged") is None


def test_minting_is_bounded_by_the_unexpired_secrets():
    clock = Clock()
    store = ClientSecrets(2, clock)
    first, _ = store.mint(10, None)
    store.mint(20, None)
    assert store.mint(10, None) is None  # two unexpired
    clock.now += 10  # the first expires: its place is free again
    assert store.mint(10, None) is not None and len(store) == 2
    assert store.redeem(first) is None


def test_the_store_holds_no_secret_in_the_clear():
    store = ClientSecrets(10)
    values = [store.mint(600, None)[0] for _ in range(3)]
    assert len(set(values)) == 3
    held = repr(store.__dict__)
    assert not any(v in held or v[len(PREFIX) :] in held for v in values)
