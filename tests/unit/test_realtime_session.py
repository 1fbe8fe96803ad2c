"""The realtime session's input audio and configuration, off the network; a connection's buffer limits and its
failures, over a fake socket."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging

import numpy as np
import pytest

from server.metrics import Metrics
from server.realtime.audio_input import BASE64_PIECE, AudioFormatError, InputAudio, base64_size, decode_base64
from server.realtime.connection import Connection, SharedLoad
from server.realtime.session import SessionConfig, SessionError, TurnDetection
from server.served_models import ServedModels
from server.settings import Settings

MANUAL = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"turn_detection": None}}}}


def test_pcm_appended_in_odd_pieces_resamples_to_the_whole_streams_samples():
    t = np.arange(24000 * 2) / 24000
    pcm = (np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2").tobytes()
    whole = InputAudio("audio/pcm")
    expected = np.concatenate([whole.append(pcm), whole.flush()])
    pieces = InputAudio("audio/pcm")
    got, i = [], 0
    for size in [1, 3, 999, 4801, 2, 7777] * 100:  # pieces that split samples in two
        got.append(pieces.append(pcm[i : i + size]))
        i += size
        if i >= len(pcm):
            break
    got.append(pieces.append(pcm[i:]))
    got.append(pieces.flush())
    got = np.concatenate(got)
    assert len(expected) == 32000 and np.array_equal(got, expected)


@pytest.mark.parametrize(("kind", "codec"), [("audio/pcmu", "pcm_mulaw"), ("audio/pcma", "pcm_alaw")])
def test_g711_at_8_khz_becomes_the_same_tone_at_16_khz(kind, codec):
    import av

    tone = (np.sin(2 * np.pi * 300 * np.arange(8000) / 8000) * 16000).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(tone.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 8000
    encoder = av.CodecContext.create(codec, "w")
    encoder.sample_rate, encoder.layout, encoder.format = 8000, "mono", "s16"
    encoded = b"".join(bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)])
    assert len(encoded) == 8000  # one byte per sample
    audio = InputAudio(kind)
    samples = np.concatenate([audio.append(encoded), audio.flush()])
    assert len(samples) == 16000
    expected = np.sin(2 * np.pi * 300 * np.arange(16000) / 16000) * 16000 / 32768
    middle = slice(100, -100)  # the resampler's edges
    assert np.corrcoef(samples[middle], expected[middle])[0, 1] > 0.99


def test_garbage_base64_and_unknown_formats_are_errors():
    with pytest.raises(AudioFormatError):
        decode_base64("not base64 !!")
    assert decode_base64(base64.b64encode(b"\x01\x02").decode()) == b"\x01\x02"
    with pytest.raises(AudioFormatError):
        InputAudio("audio/flac")


@pytest.mark.parametrize("size", [0, 1, 2, 3, BASE64_PIECE * 3 // 4, BASE64_PIECE * 3 // 4 + 1, 3 * BASE64_PIECE + 5])
def test_base64_decoded_in_pieces_is_the_whole_strings_bytes(size):
    raw = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    data = base64.b64encode(raw).decode()
    assert decode_base64(data) == raw and base64_size(data) == size


def test_base64_padding_at_a_piece_boundary_is_refused_as_the_whole_string_would_be():
    piece = base64.b64encode(bytes(BASE64_PIECE * 3 // 4 - 1)).decode()  # a whole piece, ending in "="
    assert len(piece) == BASE64_PIECE and piece.endswith("=")
    with pytest.raises(binascii.Error):
        base64.b64decode(piece + "AAAA", validate=True)
    with pytest.raises(AudioFormatError):
        decode_base64(piece + "AAAA")


def test_session_update_merges_and_refuses_what_it_cannot_do():
    s = SessionConfig(Settings())
    assert s.turn_detection.silence_duration_ms == 500 and s.format_type == "audio/pcm"
    s.update({"type": "transcription", "audio": {"input": {"transcription": {"language": "en", "prompt": "Names."}}}})
    assert (s.language, s.prompt, s.turn_detection.threshold) == ("en", "Names.", 0.5)  # the rest kept
    s.update({"type": "transcription", "audio": {"input": {"turn_detection": None, "format": {"type": "audio/pcmu"}}}})
    assert s.turn_detection is None and s.format_type == "audio/pcmu" and s.language == "en"
    body = s.body()
    assert body["audio"]["input"]["transcription"]["model"] == "tiny.en"
    bad = [
        ({"type": "realtime"}, "session.type"),
        ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}}, "turn_detection.eagerness"),
        ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad", "threshold": 0.3}}}}, "turn_detection.threshold"),
        ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}}, "threshold"),
        ({"type": "transcription", "audio": {"input": {"transcription": {"language": "xx"}}}}, "language"),
        ({"type": "transcription", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, "noise_reduction"),
        ({"type": "transcription", "include": ["item.logprobs"]}, "include"),
        ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 100}}}}, "idle_timeout_ms"),
        ({"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "rate"),
        ("nope", "session"),
    ]  # fmt: skip
    for update, param in bad:
        with pytest.raises(SessionError) as info:
            s.update(update)
        assert param in (info.value.param or ""), (update, info.value.param)
    assert s.body() == body  # a refused update changes nothing
    s.update({"type": "transcription", "include": ["item.input_audio_transcription.logprobs"]})
    assert s.logprobs and s.body()["include"] == ["item.input_audio_transcription.logprobs"]


def test_session_update_stores_the_values_the_model_coerced():
    s = SessionConfig(Settings())
    td = {"type": "server_vad", "threshold": "0.7", "prefix_padding_ms": "200", "silence_duration_ms": "800.0",
          "idle_timeout_ms": "6000"}  # fmt: skip
    s.update({"type": "transcription", "audio": {"input": {"turn_detection": td, "format": {"rate": 24000.0}}}})
    assert s.turn_detection == TurnDetection(0.7, 200, 800, 6000)
    stored = s.body()["audio"]["input"]
    assert [type(stored["turn_detection"][k]) for k in td if k != "type"] == [float, int, int, int]
    assert type(stored["format"]["rate"]) is int
    json.dumps(s.body())  # what session.updated carries


@pytest.mark.parametrize(
    ("update", "param"),
    [
        ({"format": {"type": "audio/pcm", "rate": "x"}}, "session.audio.input.format.rate"),
        ({"format": {"type": 5}}, "session.audio.input.format.type"),
        ({"turn_detection": {}}, "session.audio.input.turn_detection.type"),
        (
            {"turn_detection": {"type": "server_vad", "threshold": "high"}},
            "session.audio.input.turn_detection.threshold",
        ),
        ({"transcription": {"model": 5}}, "session.audio.input.transcription.model"),
        ({"transcription": {"prompt": ["a"]}}, "session.audio.input.transcription.prompt"),
    ],
)
def test_a_value_that_cannot_be_coerced_is_refused_with_the_clients_path(update, param):
    s = SessionConfig(Settings())
    with pytest.raises(SessionError) as info:
        s.update({"type": "transcription", "audio": {"input": update}})
    assert info.value.param == param and info.value.code == "invalid_value"


def test_a_session_accepts_exactly_the_models_the_http_routes_accept():
    from server.errors import APIError
    from server.parsing.fields import check_model

    settings = Settings(served_model_name="my-whisper", model_alias=["gpt-4o-transcribe"])
    names = ["my-whisper", "whisper-1", "gpt-4o-transcribe", "tiny.en", "gpt-4o-mini-transcribe", "WHISPER-1", ""]
    for name in names:
        try:
            check_model(name, settings)
            http_accepts = True
        except APIError:
            http_accepts = False
        s = SessionConfig(settings)
        try:
            s.update({"type": "transcription", "audio": {"input": {"transcription": {"model": name}}}})
        except SessionError as exc:
            assert not http_accepts, name
            assert (exc.param, exc.code) == ("session.audio.input.transcription.model", "model_not_found")
            assert s.body()["audio"]["input"]["transcription"]["model"] == "my-whisper"
        else:
            assert http_accepts, name
            assert s.body()["audio"]["input"]["transcription"]["model"] == name
    assert names[:3] == settings.model_ids  # each served name was tried


class FakeSocket:
    """The two ends of a realtime transport in one process: the test puts client events in (None: the client has
    gone), reads server events."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict] = asyncio.Queue()

    async def receive(self) -> str | None:
        return await self.inbox.get()

    async def send_text(self, text: str) -> None:
        self.outbox.put_nowait(json.loads(text))

    async def close(self, code: int = 1000) -> None:
        pass

    def send(self, event: dict) -> None:
        self.inbox.put_nowait(json.dumps(event))

    async def next(self) -> dict:
        return await asyncio.wait_for(self.outbox.get(), 10)

    async def sync(self) -> None:
        """Wait until every event sent so far is handled (an unsupported event's error comes after them)."""
        self.send({"type": "sync"})
        while (await self.next())["error"]["message"].find("'sync'") < 0:
            pass


class NoSpeech:
    def stream(self) -> None:
        return None  # these sessions commit by hand


def pcm_b64(seconds: float) -> str:
    tone = np.sin(2 * np.pi * 220 * np.arange(int(24000 * seconds)) / 24000) * 8000
    return base64.b64encode(tone.astype("<i2").tobytes()).decode()


async def open_session(settings: Settings, load: SharedLoad) -> tuple[FakeSocket, asyncio.Task]:
    ws = FakeSocket()
    models = ServedModels(settings)  # no engine: these sessions never decode
    task = asyncio.ensure_future(Connection(ws, models, settings, NoSpeech(), Metrics(), load).run())
    assert (await ws.next())["type"] == "session.created"
    ws.send(MANUAL)
    assert (await ws.next())["type"] == "session.updated"
    return ws, task


def test_sessions_share_the_servers_buffer_cap_counted_before_decoding():
    settings = Settings(realtime_max_buffered_seconds_total=3.0)

    async def body():
        load = SharedLoad()
        (a, run_a), (b, run_b) = await open_session(settings, load), await open_session(settings, load)
        a.send({"type": "input_audio_buffer.append", "audio": pcm_b64(2.0)})  # large: decoded in a worker thread
        await a.sync()
        held_by_a = load.buffered_samples
        assert abs(held_by_a - 2 * 16000) < 100
        b.send({"type": "input_audio_buffer.append", "audio": pcm_b64(1.5), "event_id": "e1"})
        err = (await b.next())["error"]
        assert (err["type"], err["code"], err["event_id"]) == ("server_error", "server_buffer_full", "e1")
        assert load.buffered_samples == held_by_a  # nothing lost for a, nothing kept of b's
        b.send({"type": "input_audio_buffer.append", "audio": pcm_b64(0.5)})  # fits beside a's
        await b.sync()
        a.send({"type": "input_audio_buffer.clear"})
        assert (await a.next())["type"] == "input_audio_buffer.cleared"
        b.send({"type": "input_audio_buffer.append", "audio": pcm_b64(1.5)})  # fits now that a cleared
        await b.sync()
        assert abs(load.buffered_samples - 2 * 16000) < 100
        for ws in (a, b):
            ws.inbox.put_nowait(None)
        await asyncio.gather(run_a, run_b)
        assert load.buffered_samples == 0  # closed sessions hold nothing

    asyncio.run(body())


def test_an_events_unexpected_failure_is_a_server_error_and_the_session_goes_on(monkeypatch, caplog):
    def broken(self, data):
        raise RuntimeError(f"boom in {__file__}")

    monkeypatch.setattr(InputAudio, "append_base64", broken)

    async def body():
        ws, run = await open_session(Settings(), SharedLoad())
        for i in range(3):
            ws.send({"type": "input_audio_buffer.append", "audio": pcm_b64(0.1), "event_id": f"e{i}"})
            err = (await ws.next())["error"]
            assert (err["type"], err["code"], err["event_id"]) == ("server_error", "server_error", f"e{i}")
            assert "boom" not in err["message"] and "/" not in err["message"] and "Traceback" not in err["message"]
        ws.send({"type": "input_audio_buffer.clear"})
        assert (await ws.next())["type"] == "input_audio_buffer.cleared"
        ws.inbox.put_nowait(None)
        await run

    with caplog.at_level(logging.INFO, logger="server.realtime.connection"):
        asyncio.run(body())
    failures = [r for r in caplog.records if "input_audio_buffer.append" in r.getMessage()]
    assert len(failures) == 3 and failures[0].exc_info is not None
    assert all(r.exc_info is None for r in failures[1:])  # one traceback, not one per attempt


def test_appends_sent_faster_than_they_are_heard_are_heard_in_order_several_at_a_time():
    """A session does not wait for its append's decode and VAD passes before it reads the next event: the appends
    that arrive meanwhile go into the next pass together (a second of audio at most), in order, and the stream is
    what one append of it all decodes to; an event after them (here, an unsupported one) is answered once they are
    heard."""
    tone = (np.sin(2 * np.pi * 220 * np.arange(24000 * 2) / 24000) * 8000).astype("<i2").tobytes()
    pieces = [tone[i : i + 4800] for i in range(0, len(tone), 4800)]  # 20 appends of 0.1 s

    async def body():
        load = SharedLoad()
        items = []
        run_pass = load.appends.run_pass

        def counting(work):
            items.extend(len(appends) for _, appends in work)
            return run_pass(work)

        load.appends.run_pass = counting
        ws, run = await open_session(Settings(), load)
        for piece in pieces:
            ws.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
        await ws.sync()
        heard = load.buffered_samples
        ws.inbox.put_nowait(None)
        await run
        return items, heard

    items, heard = asyncio.run(body())
    assert sum(items) == len(pieces) and len(items) < len(pieces) and max(items) > 1
    assert max(items) <= 10  # a second of audio a pass at most: a session that floods waits its turn
    assert heard == len(InputAudio("audio/pcm").append(tone))


def test_a_session_flooding_appends_does_not_hold_another_sessions_append_behind_its_own():
    flood = base64.b64encode(bytes(4800)).decode()  # 0.1 s each

    async def body():
        load = SharedLoad()
        passes = []
        run_pass = load.appends.run_pass

        def recording(work):
            passes.append([len(appends) for _, appends in work])
            return run_pass(work)

        load.appends.run_pass = recording
        (a, run_a), (b, run_b) = await open_session(Settings(), load), await open_session(Settings(), load)
        for _ in range(100):  # ten seconds of audio at once
            a.send({"type": "input_audio_buffer.append", "audio": flood})
        await asyncio.sleep(0)
        b.send({"type": "input_audio_buffer.append", "audio": flood})
        await b.sync()
        heard_b = len(passes)  # b's one append is heard by now
        await a.sync()
        for ws in (a, b):
            ws.inbox.put_nowait(None)
        await asyncio.gather(run_a, run_b)
        return passes, heard_b

    passes, heard_b = asyncio.run(body())
    assert sum(sum(p) for p in passes) == 101 and max(max(p) for p in passes) <= 10
    assert heard_b <= 3 < len(passes)  # within the first passes, not after a's hundred appends
