"""POST /v1/audio/transcriptions through the real SDK (sync and async) and a real uvicorn."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
import srt
import webvtt
from openai.types.audio import Transcription, TranscriptionVerbose

from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words, words

TEXT_PLAIN = "text/plain; charset=utf-8"


def vtt_seconds(timestamp: str) -> float:
    hours, minutes, seconds = timestamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@pytest.mark.fast
def test_json_default_sync_and_async_agree(server, data_dir):
    path = data_dir / JFK
    result = server.client().audio.transcriptions.create(file=path, model="whisper-1")
    assert isinstance(result, Transcription)
    assert contains_words(result.text, JFK_WORDS), result.text
    assert result.text == result.text.strip()
    assert result.usage.type == "duration" and result.usage.seconds == 11

    async def run_async() -> Transcription:
        async with server.async_client() as client:
            return await client.audio.transcriptions.create(file=path, model="whisper-1")

    assert asyncio.run(run_async()).text == result.text


@pytest.mark.parametrize(
    ("response_format", "content_type"),
    [
        ("json", "application/json"),
        ("verbose_json", "application/json"),
        ("text", TEXT_PLAIN),
        ("srt", TEXT_PLAIN),
        ("vtt", TEXT_PLAIN),
    ],
)
def test_content_types(server, data_dir, response_format, content_type):
    raw = server.client().audio.transcriptions.with_raw_response.create(
        file=data_dir / JFK, model="whisper-1", response_format=response_format
    )
    assert raw.status_code == 200
    assert raw.headers["content-type"] == content_type


@pytest.mark.fast
def test_all_formats_tell_the_same_story(server, data_dir):
    client = server.client()
    create = client.audio.transcriptions.create
    path = data_dir / JFK
    plain = create(file=path, model="whisper-1").text
    text = create(file=path, model="whisper-1", response_format="text")
    assert isinstance(text, str) and text == plain + "\n"

    subs = list(srt.parse(create(file=path, model="whisper-1", response_format="srt")))
    assert subs and [s.index for s in subs] == list(range(1, len(subs) + 1))
    assert words(" ".join(s.content for s in subs)) == words(plain)

    vtt = create(file=path, model="whisper-1", response_format="vtt")
    assert vtt.startswith("WEBVTT\n")
    captions = list(webvtt.from_string(vtt))
    assert words(" ".join(c.text for c in captions)) == words(plain)
    assert [vtt_seconds(c.start) for c in captions] == pytest.approx([s.start.total_seconds() for s in subs])

    verbose = create(file=path, model="whisper-1", response_format="verbose_json", timestamp_granularities=["segment"])
    assert isinstance(verbose, TranscriptionVerbose)
    assert verbose.text == plain
    assert words(" ".join(s.text for s in verbose.segments)) == words(plain)
    for sub, seg in zip(subs, verbose.segments):
        assert sub.start.total_seconds() == pytest.approx(seg.start, abs=1e-3)
        assert sub.end.total_seconds() == pytest.approx(seg.end, abs=1e-3)


def test_verbose_json_fields_and_segment_times(server, data_dir):
    raw = server.client().audio.transcriptions.with_raw_response.create(
        file=data_dir / JFK, model="whisper-1", response_format="verbose_json"
    )
    body = json.loads(raw.text)
    assert body["task"] == "transcribe"
    assert body["language"] == "english"
    assert isinstance(body["duration"], float) and body["duration"] == pytest.approx(11.0, abs=0.05)
    assert body["usage"] == {"type": "duration", "seconds": 11}
    segments = body["segments"]
    assert segments
    for i, seg in enumerate(segments):
        assert set(seg) == {
            "id",
            "seek",
            "start",
            "end",
            "text",
            "tokens",
            "temperature",
            "avg_logprob",
            "compression_ratio",
            "no_speech_prob",
        }
        assert seg["id"] == i
        assert isinstance(seg["seek"], int) and all(isinstance(t, int) for t in seg["tokens"])
        assert 0.0 <= seg["start"] <= seg["end"] <= body["duration"] + 0.02
        assert 0.0 <= seg["no_speech_prob"] <= 1.0 and seg["avg_logprob"] <= 0.0
    starts = [s["start"] for s in segments]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    ends = [s["end"] for s in segments]
    assert ends == sorted(ends)
    TranscriptionVerbose.model_validate(body)


def test_long_audio_is_transcribed_whole(server, data_dir):
    path = data_dir / "g2_en_earnings22_4482311_3-62s.wav"  # ~60 s: more than two 30 s windows
    verbose = server.client().audio.transcriptions.create(file=path, model="whisper-1", response_format="verbose_json")
    assert verbose.duration > 55
    assert verbose.segments[-1].end > 45, "later windows are missing"
    assert all(a.start <= b.start for a, b in zip(verbose.segments, verbose.segments[1:]))
    assert all(s.end <= verbose.duration + 0.02 for s in verbose.segments)
    assert len(words(verbose.text)) > 70
    assert contains_words(verbose.text, words("we are gathered to review"))  # first window
    assert contains_words(verbose.text, words("profit from recurring operations"))  # last window


@pytest.mark.parametrize(
    "name",
    [
        "g4_en_sonnet1-excerpt_mp3.mp3",
        "g4_en_sonnet1-excerpt_ogg.ogg",
        "g4_en_sonnet1-excerpt_m4a.m4a",
        "g4_en_sonnet1-excerpt_webm.webm",
        "g4_en_timit-sample_LDC93S1_44k-stereo.wav",
        "g4_en_timit-sample_LDC93S1_8k.wav",
    ],
)
def test_container_formats_rates_and_channels(server, data_dir, name):
    result = server.client().audio.transcriptions.create(file=data_dir / name, model="whisper-1")
    assert len(words(result.text)) >= 3, result.text


def test_language_prompt_and_temperature_are_accepted(server, data_dir):
    client = server.client()
    path = data_dir / JFK
    assert contains_words(
        client.audio.transcriptions.create(file=path, model="whisper-1", language="en").text, JFK_WORDS
    )
    prompted = client.audio.transcriptions.create(file=path, model="whisper-1", prompt="President Kennedy's speech.")
    assert contains_words(prompted.text, words("ask not what your country can do"))
    sampled = client.audio.transcriptions.create(file=path, model="whisper-1", temperature=0.2)
    assert words(sampled.text)
    # tiny.en is English-only: another language is a bad request naming the field.
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=path, model="whisper-1", language="de")
    assert info.value.body["param"] == "language"


def test_served_model_name_is_accepted(server, data_dir):
    served = server.client().models.list().data[0].id
    result = server.client().audio.transcriptions.create(file=data_dir / JFK, model=served)
    assert contains_words(result.text, JFK_WORDS)


@pytest.mark.fast
def test_word_timestamps_through_the_sdk(server, data_dir):
    client = server.client()
    both = client.audio.transcriptions.create(
        file=data_dir / JFK, model="whisper-1", response_format="verbose_json",
        timestamp_granularities=["segment", "word"],
    )  # fmt: skip
    assert isinstance(both, TranscriptionVerbose)
    assert [w.word for w in both.words][:4] == ["And", "so", "my", "fellow"]
    assert all(0 <= w.start <= w.end <= both.duration for w in both.words)
    assert [w.start for w in both.words] == sorted(w.start for w in both.words)
    assert both.segments and words(" ".join(w.word for w in both.words)) == words(both.text)
    only_words = client.audio.transcriptions.create(
        file=data_dir / JFK, model="whisper-1", response_format="verbose_json", timestamp_granularities=["word"]
    )
    assert only_words.words and not only_words.segments
