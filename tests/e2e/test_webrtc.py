"""Realtime sessions over WebRTC on a real server: an aiortc peer (what a phone or a browser is to the server) sets
up the call through the official SDK's `realtime.calls.create`, speaks real clips on an Opus track at real-time
pace and reads the protocol's events on the `oai-events` data channel, every one parsed by the SDK's models. The
session behind a call is the WebSocket's: the same turns and transcripts for the same speech. Offers a
transcription call cannot use, calls that never connect, and hang-ups end cleanly and free their session."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import TypeAdapter

from tests.helpers.realtime import chunks, pcm_at
from tests.helpers.server import RemoteServer, metric
from tests.helpers.transcripts import normalize_text
from tests.helpers.webrtc import RATE, ClipTrack, WebRTCClient

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
CLIPS = ["g1_en_librispeech-test-clean_1221-135766-0002.wav", "g1_en_librispeech-test-clean_61-70968-0000.flac"]
COMPLETED = "conversation.item.input_audio_transcription.completed"


def conversation(data_dir, rate: int) -> np.ndarray:
    """Two utterances with 1.5 s of silence between and after them, as 16-bit samples at `rate`."""
    silence = np.zeros(int(1.5 * rate), dtype="<i2")
    parts = [np.zeros(rate // 2, dtype="<i2")]
    for name in CLIPS:
        parts += [pcm_at(data_dir / name, rate), silence]
    return np.concatenate(parts)


async def webrtc_turns(server, stream: np.ndarray) -> tuple[list[str], list[str]]:
    """The call's event types and its turns' transcripts, the stream spoken on the track under server VAD."""
    track = ClipTrack(stream)
    call = WebRTCClient(track)
    await call.start(server.async_client(), session={"type": "transcription"})
    kinds, transcripts = [], []
    try:
        while len(transcripts) < len(CLIPS):
            event = SERVER_EVENT.validate_python(await call.next_event()).model_dump()
            kinds.append(event["type"])
            if event["type"] == COMPLETED:
                transcripts.append(event["transcript"])
    finally:
        await call.close()
    return kinds, transcripts


def websocket_turns(server, stream: np.ndarray) -> list[str]:
    with server.client().realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        for piece in chunks(stream.tobytes(), 48):
            conn.input_audio_buffer.append(audio=piece)
        transcripts = []
        for event in conn:
            if event.type == COMPLETED:
                transcripts.append(event.transcript)
                if len(transcripts) == len(CLIPS):
                    return transcripts
    raise AssertionError("the session closed before its turns were transcribed")


def test_a_call_through_the_sdk_transcribes_its_turns_as_a_websocket_session_does(server, data_dir):
    kinds, over_webrtc = asyncio.run(webrtc_turns(server, conversation(data_dir, RATE)))
    assert kinds[0] == "session.created"
    assert kinds.count("input_audio_buffer.speech_started") == kinds.count("input_audio_buffer.speech_stopped") == 2
    assert kinds.count("input_audio_buffer.committed") == 2
    over_websocket = websocket_turns(server, conversation(data_dir, 24000))
    # the same words: the track's audio went through Opus, a lossy codec, so a mark or a letter's case may differ
    assert [normalize_text(t) for t in over_webrtc] == [normalize_text(t) for t in over_websocket]
    assert all(len(t.split()) >= 5 for t in over_webrtc), over_webrtc


def test_events_on_the_channel_and_a_hang_up_end_the_call_and_free_its_session(server, data_dir):
    async def body():
        before = metric(server, "whisper_realtime_sessions")
        track = ClipTrack(pcm_at(data_dir / "g1_en_jfk.flac", RATE), lead_s=0.3)
        call = WebRTCClient(track)
        manual = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
        await call.start(server.async_client(), session=manual)
        created = await call.next_event()
        assert created["session"]["audio"]["input"]["turn_detection"] is None
        assert metric(server, "whisper_realtime_sessions") == before + 1
        call.send({"type": "input_audio_buffer.commit", "event_id": "too-soon"})  # no audio yet
        error = (await call.until("error"))[0]["error"]
        assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "too-soon")
        await track.said.wait()
        await asyncio.sleep(0.3)  # the last packets' way through the jitter buffer
        call.send({"type": "input_audio_buffer.commit"})
        completed, _ = await call.until(COMPLETED)
        assert "country" in completed["transcript"].lower()

        await server.async_client().realtime.calls.hangup(call.call_id)
        closed = asyncio.get_running_loop().create_future()
        call.channel.on("close", lambda: closed.done() or closed.set_result(True))
        if call.channel.readyState != "closed":
            await asyncio.wait_for(closed, 30)
        await call.close()
        for _ in range(50):
            if metric(server, "whisper_realtime_sessions") == before:
                break
            await asyncio.sleep(0.1)
        assert metric(server, "whisper_realtime_sessions") == before
        with pytest.raises(openai.NotFoundError):
            await server.async_client().realtime.calls.hangup(call.call_id)  # gone

    asyncio.run(body())


def offer_of(*, track: bool = True, channel: bool = True, video: bool = False) -> str:
    async def make() -> str:
        client = WebRTCClient(ClipTrack(np.zeros(RATE, dtype="<i2")) if track else None)
        if not channel:
            client.pc = type(client.pc)()
            client.pc.addTrack(ClipTrack(np.zeros(RATE, dtype="<i2")))
        if video:
            client.pc.addTransceiver("video")
        try:
            return await client.offer()
        finally:
            await client.pc.close()

    return asyncio.run(make())


@pytest.mark.fast
def test_offers_a_transcription_call_cannot_use_get_openai_errors(server):
    def post(body, content_type: str = "application/sdp", **kwargs) -> httpx.Response:
        headers = {"content-type": content_type} if content_type else {}
        return httpx.post(f"{server.base_url}/realtime/calls", content=body, headers=headers, timeout=30, **kwargs)

    def refused(response: httpx.Response, status: int, code: str) -> dict:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code and set(error) == {"message", "type", "param", "code"}
        assert "/" + "home" not in error["message"] and "Traceback" not in error["message"]
        return error

    refused(post("hello"), 400, "invalid_offer")
    assert "data channel" in refused(post(offer_of(channel=False)), 400, "invalid_offer")["message"]
    assert "no audio" in refused(post(offer_of(track=False)), 400, "invalid_offer")["message"]
    assert "video" in refused(post(offer_of(video=True)), 400, "invalid_offer")["message"]
    broken = offer_of().replace("a=fingerprint", "a=fingerprunt").replace("a=ice-ufrag", "a=ice-nope")
    refused(post(broken), 400, "invalid_offer")
    refused(post(b"\xff\xfe v=0"), 400, "invalid_value")
    refused(post("v=0\n" + "a=x\n" * 40_000), 413, "request_too_large")
    refused(post(offer_of(), content_type="application/json"), 400, "invalid_content_type")
    refused(post(None, content_type=None, files={"session": (None, "{}")}), 400, "missing_required_parameter")
    bad_session = (
        '{"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}}'
    )
    error = refused(post(None, content_type=None, files={"sdp": (None, offer_of()), "session": (None, bad_session)}),
                    400, "invalid_value")  # fmt: skip
    assert error["param"] == "session.audio.input.turn_detection.threshold"
    refused(post(None, content_type=None, files={"sdp": (None, offer_of()), "session": (None, "[1]")}), 400,
            "invalid_type")  # fmt: skip
    assert httpx.post(f"{server.base_url}/realtime/calls/rtc_nope/hangup", timeout=30).status_code == 404


def test_a_call_that_never_connects_holds_its_session_only_until_the_connect_timeout():
    with RemoteServer("--realtime-max-sessions", "1", "--realtime-webrtc-connect-timeout-s", "2") as remote:

        def post() -> httpx.Response:
            return httpx.post(f"{remote.base_url}/realtime/calls", content=offer_of(), timeout=30,
                              headers={"content-type": "application/sdp"})  # fmt: skip

        first = post()  # answered, and never applied by its client
        assert first.status_code == 201 and first.headers["content-type"].startswith("application/sdp")
        assert first.headers["location"].startswith("/v1/realtime/calls/rtc_")
        assert first.text.startswith("v=0")
        busy = post()
        assert busy.status_code == 429 and busy.json()["error"]["code"] == "session_limit_reached"
        deadline = time.monotonic() + 20
        while metric(remote, "whisper_realtime_sessions") != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(remote, "whisper_realtime_sessions") == 0
        assert post().status_code == 201


class FloodTrack(ClipTrack):
    """A hostile peer's track: its frames as fast as the encoder takes them, not at a microphone's pace."""

    async def recv(self):
        self.start = time.perf_counter() - self.position / RATE  # always due
        return await super().recv()


def test_a_track_that_runs_ahead_of_the_clock_ends_its_call_and_the_server_serves_on(server, data_dir):
    async def body():
        call = WebRTCClient(FloodTrack(np.zeros(RATE * 600, dtype="<i2")))
        await call.start(server.async_client())
        try:
            error = (await call.until("error", timeout_s=60))[0]["error"]
            assert error["code"] == "invalid_audio" and "real time" in error["message"]
        finally:
            await call.close()

    asyncio.run(body())
    with (data_dir / "g1_en_jfk.flac").open("rb") as audio:
        assert "country" in server.client().audio.transcriptions.create(file=audio, model="whisper-1").text
