"""stream=true through real uvicorn and the real SDK: OpenAI's transcript.text.delta/done events, sync and async.

Deltas joined must equal the done text, which must equal the non-streamed text of the same request; the first
delta must come while later windows are still decoding; dropping the stream aborts the request.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from tests.helpers.transcripts import JFK

LONG = "g2_en_earnings22_4482311_3-62s.wav"  # ~60 s: two windows or more
LONGER = "g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"  # ~230 s, to abandon mid-way


def running_sequences(server) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return float(re.search(r"^whisper_running_sequences (\S+)$", text, re.MULTILINE).group(1))


def check_events(events: list) -> tuple[str, TranscriptionTextDoneEvent]:
    """Deltas then exactly one done event; returns the joined deltas and the done event."""
    assert events, "no events"
    *deltas, done = events
    assert all(isinstance(e, TranscriptionTextDeltaEvent) and e.delta for e in deltas), deltas
    assert isinstance(done, TranscriptionTextDoneEvent), done
    assert done.usage is not None and done.usage.type == "tokens"
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    return "".join(e.delta for e in deltas), done


@pytest.mark.parametrize("clip", [JFK, LONG])
def test_sync_stream_equals_the_non_streamed_text(server, data_dir, clip):
    client = server.client()
    expected = client.audio.transcriptions.create(file=data_dir / clip, model="whisper-1").text
    start = time.monotonic()
    first_delta_s = None
    events = []
    for event in client.audio.transcriptions.create(file=data_dir / clip, model="whisper-1", stream=True):
        if first_delta_s is None and event.type == "transcript.text.delta":
            first_delta_s = time.monotonic() - start
        events.append(event)
    total_s = time.monotonic() - start
    joined, done = check_events(events)
    assert joined == done.text == expected
    print(f"\n{clip}: {len(events) - 1} deltas, first after {first_delta_s:.2f} s, done after {total_s:.2f} s")
    if clip == LONG:
        assert len(events) >= 3  # one delta per window at least
        assert first_delta_s < total_s


@pytest.mark.fast
def test_async_streams_in_parallel_equal_the_non_streamed_texts(server, data_dir):
    client = server.client()
    expected = {
        clip: client.audio.transcriptions.create(file=data_dir / clip, model="whisper-1").text for clip in (JFK, LONG)
    }

    async def stream(clip: str) -> list:
        async with server.async_client() as aclient:
            response = await aclient.audio.transcriptions.create(
                file=data_dir / clip, model="whisper-1", stream=True, response_format="text"
            )
            return [event async for event in response]

    async def both() -> list[list]:
        return await asyncio.gather(stream(JFK), stream(LONG))

    for clip, events in zip((JFK, LONG), asyncio.run(both())):
        joined, done = check_events(events)
        assert joined == done.text == expected[clip]


def test_chunked_stream_equals_chunked_text(server, data_dir):
    client = server.client()
    args = {"file": data_dir / LONG, "model": "whisper-1", "chunking_strategy": "auto"}
    expected = client.audio.transcriptions.create(**args).text
    joined, done = check_events(list(client.audio.transcriptions.create(**args, stream=True)))
    assert joined == done.text == expected
    assert len(expected.split()) > 80


def test_dropping_the_stream_aborts_the_request(server, data_dir):
    client = server.client()
    stream = client.audio.transcriptions.create(file=data_dir / LONGER, model="whisper-1", stream=True)
    first = next(iter(stream))
    assert first.type == "transcript.text.delta"
    assert running_sequences(server) >= 1  # 230 s of audio: far from done
    stream.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and running_sequences(server) > 0:
        time.sleep(0.2)
    assert running_sequences(server) == 0
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert client.audio.transcriptions.create(file=data_dir / JFK, model="whisper-1").text
