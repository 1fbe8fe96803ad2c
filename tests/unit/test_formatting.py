"""Response bodies, parsed back with real parsers: the SDK's models, `srt` and `webvtt`."""

from __future__ import annotations

import json
import math
from datetime import timedelta

import pytest
import srt
import webvtt
from openai.types.audio import Transcription, TranscriptionVerbose, Translation, TranslationVerbose

from engine.request import Segment, Task, TranscriptionResult
from server.formatting import (
    JSON_MEDIA_TYPE,
    TEXT_MEDIA_TYPE,
    format_srt,
    format_vtt,
    language_name,
    render,
)
from server.protocol import ResponseFormat

SEGMENT_FIELDS = {
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


def segment(i: int, start: float, end: float, text: str, **overrides) -> Segment:
    fields = {
        "id": i,
        "seek": int(start * 100) // 3000 * 3000,
        "start": start,
        "end": end,
        "text": text,
        "tokens": [50364 + i, 400 + i, 50414 + i],
        "temperature": 0.0,
        "avg_logprob": -0.31,
        "compression_ratio": 1.4,
        "no_speech_prob": 0.02,
    }
    return Segment(**{**fields, **overrides})


@pytest.fixture
def result() -> TranscriptionResult:
    segments = [
        segment(0, 0.0, 7.6000000000000005, " And so my fellow Americans, ask not what your country can do for you,"),
        segment(1, 7.6, 10.5, " ask what you can do for your country."),
        segment(2, 3725.25, 3727.0, " An hour later."),
    ]
    return TranscriptionResult(
        text="".join(s.text for s in segments), segments=segments, language="en", duration=3727.4, num_tokens=9
    )


def test_json_is_sdk_transcription_with_whole_second_usage(result):
    body = render(result, ResponseFormat.JSON, Task.TRANSCRIBE)
    assert body.media_type == JSON_MEDIA_TYPE
    raw = json.loads(body.content)
    assert raw["usage"] == {"type": "duration", "seconds": 3728}  # an int on the wire, rounded up
    parsed = Transcription.model_validate(raw)
    assert parsed.text == result.text.strip()
    assert not parsed.text.startswith(" ")
    assert set(raw) == {"text", "usage"}


def test_verbose_json_matches_sdk_model_and_openai_fields(result):
    body = render(result, ResponseFormat.VERBOSE_JSON, Task.TRANSCRIBE)
    assert body.media_type == JSON_MEDIA_TYPE
    raw = json.loads(body.content)
    parsed = TranscriptionVerbose.model_validate(raw)
    assert raw["task"] == "transcribe"
    assert parsed.language == "english"
    assert isinstance(raw["duration"], float) and raw["duration"] == pytest.approx(3727.4)
    assert raw["usage"] == {"type": "duration", "seconds": 3728}
    assert "words" not in raw
    assert [set(s) for s in raw["segments"]] == [SEGMENT_FIELDS] * 3
    first = raw["segments"][0]
    assert first["text"] == result.segments[0].text  # segment text keeps Whisper's leading space
    assert first["end"] == 7.6
    assert first["tokens"] == result.segments[0].tokens
    assert isinstance(first["seek"], int) and isinstance(first["id"], int)


def test_verbose_json_language_name_for_detected_language(result):
    result.language = "de"
    raw = json.loads(render(result, ResponseFormat.VERBOSE_JSON, Task.TRANSCRIBE).content)
    assert raw["language"] == "german"
    assert language_name("fr") == "french"


def test_translation_bodies_match_sdk_models(result):
    result.language = "de"
    plain = render(result, ResponseFormat.JSON, Task.TRANSLATE)
    assert Translation.model_validate_json(plain.content).text == result.text.strip()
    verbose = render(result, ResponseFormat.VERBOSE_JSON, Task.TRANSLATE)
    raw = json.loads(verbose.content)
    parsed = TranslationVerbose.model_validate(raw)
    assert parsed.language == "english"  # "always english" per OpenAI, whatever was spoken
    assert raw["task"] == "translate"
    assert len(parsed.segments) == 3


def test_text_is_plain_transcript_with_newline(result):
    body = render(result, ResponseFormat.TEXT, Task.TRANSCRIBE)
    assert body.media_type == TEXT_MEDIA_TYPE == "text/plain; charset=utf-8"
    assert body.content == result.text.strip() + "\n"


def test_srt_parses_with_srt_package(result):
    body = render(result, ResponseFormat.SRT, Task.TRANSCRIBE)
    assert body.media_type == TEXT_MEDIA_TYPE
    subs = list(srt.parse(body.content))
    assert [s.index for s in subs] == [1, 2, 3]
    assert subs[0].start == timedelta(0) and subs[0].end == timedelta(seconds=7.6)
    assert subs[2].start == timedelta(hours=1, minutes=2, seconds=5.25)
    assert [s.content for s in subs] == [s.text.strip() for s in result.segments]
    assert body.content.startswith("1\n00:00:00,000 --> 00:00:07,600\nAnd so my")
    assert "01:02:05,250 --> 01:02:07,000" in body.content


def test_vtt_parses_with_webvtt_package(result):
    body = render(result, ResponseFormat.VTT, Task.TRANSCRIBE)
    assert body.media_type == TEXT_MEDIA_TYPE
    assert body.content.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:07.600\n")
    captions = list(webvtt.from_string(body.content))
    assert [(c.start, c.end) for c in captions] == [
        ("00:00:00.000", "00:00:07.600"),
        ("00:00:07.600", "00:00:10.500"),
        ("01:02:05.250", "01:02:07.000"),
    ]
    assert [c.text for c in captions] == [s.text.strip() for s in result.segments]


def test_cues_skip_empty_segments_and_neutralize_separators():
    segments = [segment(0, 0.0, 1.0, "   "), segment(1, 1.0, 2.0, " a --> b\n\nc"), segment(2, 2.0, 3.0, " d")]
    subs = list(srt.parse(format_srt(segments)))
    assert [s.content for s in subs] == ["a -> b c", "d"]
    assert [s.index for s in subs] == [1, 2]
    assert [c.text for c in webvtt.from_string(format_vtt(segments))] == ["a -> b c", "d"]


def test_empty_result_still_valid_everywhere():
    empty = TranscriptionResult(text="", segments=[], language="en", duration=0.4)
    assert format_srt([]) == ""
    assert list(webvtt.from_string(format_vtt([]))) == []
    assert render(empty, ResponseFormat.TEXT, Task.TRANSCRIBE).content == "\n"
    raw = json.loads(render(empty, ResponseFormat.VERBOSE_JSON, Task.TRANSCRIBE).content)
    assert raw["segments"] == [] and raw["usage"]["seconds"] == 1


def test_non_finite_numbers_never_reach_json():
    bad = segment(0, 0.0, 1.0, " x", avg_logprob=-math.inf, compression_ratio=math.nan, no_speech_prob=math.nan)
    result = TranscriptionResult(text=" x", segments=[bad], language="en", duration=1.0)
    raw = json.loads(render(result, ResponseFormat.VERBOSE_JSON, Task.TRANSCRIBE).content)  # strict JSON
    TranscriptionVerbose.model_validate(raw)
    assert all(math.isfinite(raw["segments"][0][k]) for k in ("avg_logprob", "compression_ratio", "no_speech_prob"))


def test_a_streams_logprobs_are_those_of_each_delta_taken_from_all_segments_so_far():
    """LogprobStream walks each token once; what it gives each delta is token_logprobs over every segment so far."""
    from engine.request import TokenLogprob
    from server.formatting import LogprobStream, token_logprobs
    from server.streaming import DeltaText

    def segment(i: int, pieces: list[str]) -> Segment:
        items = [TokenLogprob(token=p, bytes=p.encode(), logprob=-0.1 * k) for k, p in enumerate(pieces)]
        return Segment(i, 0, 0.0, 1.0, "".join(pieces), [], 0.0, -0.1, 1.0, 0.0, logprobs=items)

    windows = [[segment(0, ["  ", " Grüß", " Gott", ","])], [segment(1, [" ça", " va", "  "])],
               [segment(2, [" bien", " 日本", "語", " "]), segment(3, [" end", "."])]]  # fmt: skip
    stream, deltas, so_far = LogprobStream(), DeltaText(), []
    for window in windows:
        so_far += window
        stream.add(window)
        start = len(deltas.sent)
        if deltas.add("".join(s.text for s in window)):
            assert stream.take(start, len(deltas.sent)) == token_logprobs(so_far, start, len(deltas.sent))
