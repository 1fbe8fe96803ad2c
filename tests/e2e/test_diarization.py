"""diarized_json: who spoke when, over HTTP, read by the openai SDK, on a recording assembled from LibriSpeech
clips of two readers (known turns, pauses of several lengths)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from openai.types.audio import TranscriptionDiarized

# (clip, reader): readers 1688 and 1221 take turns
TURNS = [
    ("g1_en_librispeech-test-other_1688-142285-0000.flac", "1688"),
    ("g1_en_librispeech-test-clean_1221-135766-0001.wav", "1221"),
    ("g1_en_librispeech-test-other_1688-142285-0001.flac", "1688"),
    ("g1_en_librispeech-test-clean_1221-135766-0002.wav", "1221"),
    ("g1_en_librispeech-test-other_1688-142285-0002.flac", "1688"),
]


@pytest.fixture(scope="module")
def conversation(tmp_path_factory, load_clip):
    """The turns in one 16 kHz WAV, and each turn's (start, end, reader)."""
    parts, spans, t = [], [], 0.0
    for i, (clip, reader) in enumerate(TURNS):
        audio = load_clip(clip)
        pause = np.zeros(int(16000 * (0.4 + 0.35 * i)), dtype=np.float32)
        spans.append((t, t + len(audio) / 16000, reader))
        t += (len(audio) + len(pause)) / 16000
        parts += [audio, pause]
    path = tmp_path_factory.mktemp("diarization") / "conversation.wav"
    sf.write(path, np.concatenate(parts), 16000, subtype="PCM_16")
    return path, spans


def reader_at(spans, time: float) -> str:
    return min(spans, key=lambda s: 0.0 if s[0] <= time <= s[1] else min(abs(time - s[0]), abs(time - s[1])))[2]


def test_diarized_json_labels_each_turn_with_its_reader(server, conversation):
    path, spans = conversation
    client = server.client()
    body = client.audio.transcriptions.create(file=path, model="whisper-1", response_format="diarized_json")
    assert isinstance(body, TranscriptionDiarized) and body.task == "transcribe"
    assert body.duration == pytest.approx(spans[-1][1], abs=2.0) and body.usage.type == "duration"
    assert {s.speaker for s in body.segments} == {"A", "B"}
    assert body.segments[0].speaker == "A"  # letters in order of first appearance
    # every segment's speaker is its reader's letter, one letter per reader
    letters = {}
    for s in body.segments:
        assert s.type == "transcript.text.segment" and s.start < s.end and s.text.strip()
        assert letters.setdefault(reader_at(spans, (s.start + s.end) / 2), s.speaker) == s.speaker, s
    assert len(set(letters.values())) == 2
    assert [s.start for s in body.segments] == sorted(s.start for s in body.segments)
    assert len({s.id for s in body.segments}) == len(body.segments)
    # the words of the transcript with word timestamps (which diarization needs; they move long-form seeking, as
    # in openai/whisper), split among the speakers
    timed = client.audio.transcriptions.create(
        file=path, model="whisper-1", response_format="verbose_json", timestamp_granularities=["word"]
    ).text
    assert body.text == timed
    assert " ".join(s.text for s in body.segments).split() == timed.split()


def test_one_reader_is_one_speaker(server, data_dir):
    body = server.client().audio.transcriptions.create(
        file=data_dir / "g1_en_jfk.flac", model="whisper-1", response_format="diarized_json"
    )
    assert {s.speaker for s in body.segments} == {"A"} and "country" in body.text


def test_the_stream_sends_each_speakers_segments_then_done(server, conversation):
    """stream=true with diarized_json: the SDK reads `transcript.text.segment` events, the same segments as the
    body, then `transcript.text.done` with the whole text."""
    path, _ = conversation
    client = server.client()
    body = client.audio.transcriptions.create(file=path, model="whisper-1", response_format="diarized_json")
    stream = client.audio.transcriptions.create(
        file=path, model="whisper-1", response_format="diarized_json", stream=True
    )
    events = list(stream)
    segments = [e for e in events if e.type == "transcript.text.segment"]
    assert [e.type for e in events] == ["transcript.text.segment"] * len(segments) + ["transcript.text.done"]
    assert [(e.id, e.start, e.end, e.text, e.speaker) for e in segments] == [
        (s.id, s.start, s.end, s.text, s.speaker) for s in body.segments
    ]
    assert events[-1].text == body.text
