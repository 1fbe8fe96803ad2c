"""stream=true in-process against a fake engine: OpenAI's SSE bytes, SDK events, errors, and the delta rule."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from engine.request import EngineDeadError
from server.streaming import DeltaText
from tests.helpers.fake_engine import FakeEngine, clients, wav_bytes

FILE = ("speech.wav", wav_bytes(2.0), "audio/wav")


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    "pieces",
    [
        [" Hello there.", " General Kenobi."],
        ["  leading spaces ", " ", "", " and trailing  ", "\n"],
        ["你好", "世界"],
        [" ", " one"],
        [],
    ],
)
def test_deltas_join_to_the_stripped_transcript(pieces):
    deltas = DeltaText()
    sent = [deltas.add(piece) for piece in pieces]
    assert "".join(sent) == "".join(pieces).strip()
    assert not sent or not sent[0][:1].isspace()


def test_stream_bytes_are_openai_sse():
    async def body():
        async with clients(FakeEngine()) as (_, http, _app):
            files = {"file": FILE}
            response = await http.post(
                "/v1/audio/transcriptions", files=files, data={"model": "whisper-1", "stream": "true"}
            )
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            blocks = response.text.split("\n\n")
            assert blocks[-1] == ""  # every event ends with a blank line
            events = [json.loads(block.removeprefix("data: ")) for block in blocks[:-1]]
            assert all(block.startswith("data: {") for block in blocks[:-1])
            assert events == [
                {"type": "transcript.text.delta", "delta": "Hello there. General Kenobi."},
                {
                    "type": "transcript.text.done",
                    "text": "Hello there. General Kenobi.",
                    "usage": {
                        "type": "tokens",
                        "input_tokens": 100,  # 2 s of audio at 50 encoder positions a second
                        "input_token_details": {"audio_tokens": 100, "text_tokens": 0},
                        "output_tokens": 11,
                        "total_tokens": 111,
                    },
                },
            ]

    run(body())


def test_sdk_reads_the_stream():
    async def body():
        async with clients(FakeEngine()) as (sdk, _, _app):
            stream = await sdk.audio.transcriptions.create(file=FILE, model="whisper-1", stream=True)
            events = [event async for event in stream]
            assert [type(e) for e in events] == [TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent]
            assert events[0].delta == events[1].text == "Hello there. General Kenobi."
            assert events[1].usage.type == "tokens" and events[1].usage.output_tokens == 11

    run(body())


def test_engine_failure_before_the_stream_is_a_status_after_it_an_error_event():
    async def body():
        async with clients(FakeEngine(submit_error=EngineDeadError("gone"))) as (sdk, _, _app):
            with pytest.raises(Exception) as info:
                await sdk.audio.transcriptions.create(file=FILE, model="whisper-1", stream=True)
            assert info.value.status_code == 503
        async with clients(FakeEngine(result_error=EngineDeadError("died"))) as (sdk, _, _app):
            stream = await sdk.audio.transcriptions.create(file=FILE, model="whisper-1", stream=True)
            with pytest.raises(Exception) as info:
                _ = [event async for event in stream]
            assert "engine stopped" in str(info.value)

    run(body())
