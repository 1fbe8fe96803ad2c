"""Several front-end processes (--api-servers): what the settings refuse with them, each front-end's share of a
server-wide bound, and the state they share (a process of its own): a secret minted through one proxy is
redeemed once through another, and a hangup asked anywhere reaches the call's front-end."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.frontends import FrontEndPlan
from server.settings import Settings
from server.shared_state import CallDirectory, connect, host


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model_ttl_s": 60}, "TTL"),
        ({"engine_process": "off"}, "--engine-process"),
        ({"lora_dir": ".", "max_loras": 2}, "--lora-dir"),
    ],
)
def test_several_front_ends_refuse_what_they_cannot_share(fields, message):
    Settings(**fields)  # fine with one
    with pytest.raises(ValidationError, match=message):
        Settings(api_servers=2, **fields)


def test_each_front_end_holds_its_share_of_a_bound():
    plan = FrontEndPlan("unused", b"key", 3)
    assert [plan.share(n) for n in (0, 1, 4, 16, 128)] == [0, 1, 2, 6, 43]
    local = plan.front_end_settings(Settings(realtime_max_sessions=100, realtime_max_buffered_seconds_total=3000))
    assert local.realtime_max_sessions == 34 and local.realtime_max_buffered_seconds_total == 1000
    assert plan.first and not FrontEndPlan("unused", b"key", 3, index=2).first
    assert plan.engine(1, 2)[0].endswith("engine-1-2.sock")


def test_a_hangup_asked_anywhere_reaches_the_calls_front_end():
    calls = CallDirectory()
    calls.add("rtc_a", 1)
    calls.add("rtc_b", 0)
    assert calls.hang_up("rtc_a") and not calls.hang_up("rtc_unknown")
    assert calls.hangups(0) == [] and calls.hangups(1) == ["rtc_a"] and calls.hangups(1) == []
    calls.hang_up("rtc_b")
    calls.remove("rtc_b")  # it ended meanwhile: nothing left to collect
    assert calls.hangups(0) == [] and not calls.hang_up("rtc_b")


def test_the_shared_state_redeems_a_secret_once_whichever_front_end_asks():
    plan = FrontEndPlan.create(2)
    try:
        state, secrets, calls = host(plan.address("state"), max_outstanding=4)
        other_secrets, other_calls = connect(plan.address("state"), max_outstanding=4)
        value, secret = secrets.mint(60, {"type": "transcription"})
        assert other_secrets.redeem(value) == secret
        assert other_secrets.redeem(value) is None and secrets.redeem(value) is None
        other_calls.add("rtc_x", 1)
        assert calls.hang_up("rtc_x") and other_calls.hangups(1) == ["rtc_x"]
        assert all(secrets.mint(60, None) is not None for _ in range(4)) and other_secrets.mint(60, None) is None
        state.shutdown()
    finally:
        plan.remove()


def test_a_call_held_here_ends_when_its_hangup_reached_another_front_end():
    import asyncio

    from server.realtime.calls import Calls

    class Call:  # what Calls needs of a WebRTC call: its id, and close() ending its session
        def __init__(self, call_id: str) -> None:
            self.id = call_id
            self.ended = asyncio.Event()

        async def close(self, code: int = 1000) -> None:
            self.ended.set()

    async def run() -> None:
        directory = CallDirectory()
        here, elsewhere = Calls(directory, front_end=1), Calls(directory, front_end=0)
        call = Call("rtc_held_by_1")
        here.start(call, call.ended.wait())
        assert await elsewhere.hangup("rtc_held_by_1") and not await elsewhere.hangup("rtc_none")
        await asyncio.wait_for(call.ended.wait(), 5)
        await asyncio.sleep(0.05)  # its session ended: it leaves the directory
        assert here.calls == {} and not directory.hang_up("rtc_held_by_1")

    asyncio.run(run())
