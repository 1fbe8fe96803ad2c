"""diarized_json: who spoke when, over HTTP, read by the openai SDK, on a recording assembled from LibriSpeech
clips of two readers (known turns, pauses of several lengths)."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
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


@pytest.fixture(scope="module")
def diarized(server, conversation) -> TranscriptionDiarized:
    """The conversation as diarized_json (no other field), asked once: the tests that read that plain answer share
    it."""
    path, _ = conversation
    return server.client().audio.transcriptions.create(file=path, model="whisper-1", response_format="diarized_json")


def reader_at(spans, time: float) -> str:
    return min(spans, key=lambda s: 0.0 if s[0] <= time <= s[1] else min(abs(time - s[0]), abs(time - s[1])))[2]


def test_diarized_json_labels_each_turn_with_its_reader(server, conversation, diarized):
    path, spans = conversation
    client = server.client()
    body = diarized
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


def test_the_stream_sends_each_speakers_segments_then_done(server, conversation, diarized):
    """stream=true with diarized_json: the SDK reads `transcript.text.segment` events, the same segments as the
    body, then `transcript.text.done` with the whole text."""
    path, _ = conversation
    client = server.client()
    body = diarized
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


def data_url(audio: np.ndarray) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, audio, 16000, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_known_speakers_name_their_segments(server, load_clip, tmp_path):
    """References from other clips of the two readers name their turns; a third reader, with no reference, keeps
    a letter."""
    turns = [("g1_en_librispeech-test-other_1688-142285-0000.flac", "Bob"),
             ("g1_en_librispeech-test-clean_1221-135766-0001.wav", "Ann"),
             ("g1_en_librispeech-test-clean_1089-134686-0001.wav", "A"),
             ("g1_en_librispeech-test-other_1688-142285-0001.flac", "Bob")]  # fmt: skip
    parts, spans, t = [], [], 0.0
    for clip, who in turns:
        audio = load_clip(clip)
        spans.append((t, t + len(audio) / 16000, who))
        t += len(audio) / 16000 + 0.8
        parts += [audio, np.zeros(int(0.8 * 16000), dtype=np.float32)]
    path = tmp_path / "three.wav"
    sf.write(path, np.concatenate(parts), 16000, subtype="PCM_16")
    ann = load_clip("g1_en_librispeech-test-clean_1221-135766-0002.wav")  # 4.8 s, not in the recording
    bob = load_clip("g1_en_librispeech-test-other_1688-142285-0002.flac")  # 2.8 s
    body = server.client().audio.transcriptions.create(
        file=path, model="whisper-1", response_format="diarized_json",
        known_speaker_names=["Ann", "Bob"], known_speaker_references=[data_url(ann), data_url(bob)],
    )  # fmt: skip
    assert {s.speaker for s in body.segments} == {"Ann", "Bob", "A"}
    for s in body.segments:
        assert s.speaker == reader_at(spans, (s.start + s.end) / 2), s


KNOWN_SPEAKER_ERRORS = {
    "a name without a reference": ({"known_speaker_names": ["Ann"]}, "known_speaker_references[]"),
    "five speakers": ({"known_speaker_names": list("abcde"), "known_speaker_references": ["data:audio/wav;base64,AA=="] * 5},
                      "known_speaker_names[]"),
    "not a data URL": ({"known_speaker_names": ["Ann"], "known_speaker_references": ["https://example.com/a.wav"]},
                       "known_speaker_references[]"),
    "a second of voice": ({"known_speaker_names": ["Ann"], "known_speaker_references": ["ONE_SECOND"]},
                          "known_speaker_references[]"),
    "not audio": ({"known_speaker_names": ["Ann"], "known_speaker_references": ["data:audio/wav;base64,aGVsbG8="]},
                  "known_speaker_references[]"),
    "without diarized_json": ({"known_speaker_names": ["Ann"], "known_speaker_references": ["ONE_SECOND"],
                               "response_format": "json"}, "known_speaker_names[]"),
}  # fmt: skip


@pytest.mark.parametrize("case", KNOWN_SPEAKER_ERRORS)
def test_bad_known_speakers_are_400_naming_the_field(server, data_dir, load_clip, case):
    kwargs, param = dict(KNOWN_SPEAKER_ERRORS[case][0]), KNOWN_SPEAKER_ERRORS[case][1]
    one_second = data_url(load_clip("g1_en_jfk.flac")[:16000])
    if "known_speaker_references" in kwargs:
        kwargs["known_speaker_references"] = [one_second if r == "ONE_SECOND" else r
                                              for r in kwargs["known_speaker_references"]]  # fmt: skip
    kwargs.setdefault("response_format", "diarized_json")
    with pytest.raises(openai.BadRequestError) as info:
        server.client().audio.transcriptions.create(file=data_dir / "g1_en_jfk.flac", model="whisper-1", **kwargs)
    assert info.value.body["param"] == param, info.value.body


STEREO = "g4_en_stereo-2ch-different-speech_fw.wav"  # different speech on the left and on the right


def test_a_stereo_call_is_one_speaker_per_channel(server, data_dir):
    """The channels differ, so each is transcribed on its own: the left's words are A's, the right's B's (averaged
    to mono, the two voices over each other come out at 0.71 WER)."""
    import jiwer

    from tests.helpers.transcripts import normalize_english as normalize

    reference = (data_dir / STEREO.replace(".wav", ".txt")).read_text()
    left, right = (part.strip() for part in reference.split("LEFT:")[1].split("RIGHT:"))
    body = server.client().audio.transcriptions.create(
        file=data_dir / STEREO, model="whisper-1", response_format="diarized_json"
    )
    said = {who: " ".join(s.text for s in body.segments if s.speaker == who) for who in ("A", "B")}
    assert {s.speaker for s in body.segments} == {"A", "B"}
    assert jiwer.wer(normalize(left), normalize(said["A"])) < 0.2, said
    assert jiwer.wer(normalize(right), normalize(said["B"])) < 0.2, said
    assert [s.start for s in body.segments] == sorted(s.start for s in body.segments)
    assert body.text.split() == " ".join(s.text for s in body.segments).split()


def test_speaker_per_channel_can_be_turned_off_and_needs_diarized_json(server, data_dir):
    client = server.client()
    mixed = client.audio.transcriptions.create(
        file=data_dir / STEREO, model="whisper-1", response_format="diarized_json",
        extra_body={"speaker_per_channel": False},
    )  # fmt: skip
    assert mixed.segments and all(s.speaker for s in mixed.segments)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(
            file=data_dir / STEREO, model="whisper-1", extra_body={"speaker_per_channel": True}
        )
    assert info.value.body["param"] == "speaker_per_channel"


def test_silence_has_no_speakers(server, tmp_path):
    path = tmp_path / "silence.wav"
    sf.write(path, np.zeros(16000 * 5, dtype=np.float32), 16000, subtype="PCM_16")
    body = server.client().audio.transcriptions.create(file=path, model="whisper-1", response_format="diarized_json")
    assert body.segments == [] and body.text == "" and body.duration == pytest.approx(5.0)


def test_the_number_of_speakers_can_be_given(server, conversation):
    """num_speakers=1 puts every segment on one speaker; min_speakers=3 makes a third (the two readers' voices
    split); both at once, or without diarized_json, are 400s naming the field."""
    path, _ = conversation
    client = server.client()
    one = client.audio.transcriptions.create(
        file=path, model="whisper-1", response_format="diarized_json", extra_body={"num_speakers": 1}
    )
    assert {s.speaker for s in one.segments} == {"A"}
    three = client.audio.transcriptions.create(
        file=path, model="whisper-1", response_format="diarized_json", extra_body={"min_speakers": 3}
    )
    assert len({s.speaker for s in three.segments}) >= 3
    for extra, param in (({"num_speakers": 2, "max_speakers": 3}, "max_speakers"), ({"num_speakers": 2}, "num_speakers"),
                         ({"min_speakers": 4, "max_speakers": 2}, "min_speakers"), ({"num_speakers": 99}, "num_speakers")):
        fmt = "json" if extra == {"num_speakers": 2} else "diarized_json"
        with pytest.raises(openai.BadRequestError) as info:
            client.audio.transcriptions.create(file=path, model="whisper-1", response_format=fmt, extra_body=extra)
        assert info.value.body["param"] == param, (extra, info.value.body)


THREE_SPEAKERS = "g1_en_3speakers_picovoice-diarization.wav"  # 19 s: three voices, a sentence or two each
# (a word of each speaker's part, the speaker's number): who says what in the recording
THREE_PARTS = (("begins", 0), ("crocodile", 1), ("gentlemen", 2))


@pytest.mark.parametrize("extra", [{"num_speakers": 3}, {"min_speakers": 3}, {"min_speakers": 3, "max_speakers": 4}])
def test_a_short_recordings_speaker_count_is_honoured(server, data_dir, extra):
    """A real 19 s recording of three speakers: told there are three (or at least three), each speaker's part gets
    its own letter and no part is split between letters."""
    body = server.client().audio.transcriptions.create(
        file=data_dir / THREE_SPEAKERS, model="whisper-1", response_format="diarized_json", extra_body=extra
    )
    assert len({s.speaker for s in body.segments}) == 3, body.segments
    letters = {}
    for word, speaker in THREE_PARTS:
        (segment,) = [s for s in body.segments if word in s.text.lower()]
        letters[speaker] = segment.speaker
    assert len(set(letters.values())) == 3, body.segments


def test_a_short_recordings_speaker_bound_caps_the_count(server, data_dir):
    body = server.client().audio.transcriptions.create(
        file=data_dir / THREE_SPEAKERS, model="whisper-1", response_format="diarized_json",
        extra_body={"max_speakers": 1},
    )  # fmt: skip
    assert {s.speaker for s in body.segments} == {"A"}


def test_the_diarization_models_can_load_at_start_up(diarization_preload_server, server, data_dir):
    remote = diarization_preload_server  # shared with test_diarization_beside_plain.py
    log = remote.log_tail(10**8)
    assert "loading the speaker diarization models" in log and "at start-up" in log
    assert log.index("speaker diarization models loaded") < log.index("serving")
    body = remote.client().audio.transcriptions.create(
        file=data_dir / THREE_SPEAKERS, model="whisper-1", response_format="diarized_json",
        extra_body={"num_speakers": 3},
    )  # fmt: skip
    assert len({s.speaker for s in body.segments}) == 3
    # without the flag (the session's server) they load after start-up, on the first diarized request (this one, or
    # an earlier test's), which the log says
    server.client().audio.transcriptions.create(
        file=data_dir / THREE_SPEAKERS, model="whisper-1", response_format="diarized_json"
    )
    log = server.log_tail(10**8)
    loads = [line for line in log.splitlines() if "loading the speaker diarization models" in line]
    assert loads and all("for the first request that asks for speakers" in line for line in loads), loads
    assert log.index(loads[0]) > log.index("serving")


def test_verbose_json_segments_carry_their_speaker_with_diarize(server, conversation):
    """The `diarize` extension labels verbose_json's own segments (boundaries, tokens and seek kept), as
    diarized_json labels speakers; without it, no `speaker` field; with another format, a 400."""
    path, spans = conversation
    client = server.client()
    body = client.audio.transcriptions.create(
        file=path, model="whisper-1", response_format="verbose_json", extra_body={"diarize": True}
    )
    labels = [s.model_extra["speaker"] for s in body.segments]
    assert set(labels) == {"A", "B"} and labels[0] == "A"
    letters = {}
    for s, label in zip(body.segments, labels):
        assert letters.setdefault(reader_at(spans, (s.start + s.end) / 2), label) == label, s
    plain = client.audio.transcriptions.create(file=path, model="whisper-1", response_format="verbose_json")
    assert all("speaker" not in (s.model_extra or {}) for s in plain.segments)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(file=path, model="whisper-1", extra_body={"diarize": True})
    assert info.value.body["param"] == "diarize"


def _passes(server) -> tuple[float, float]:
    """(passes, recordings) the diarizer has run so far, from /metrics."""
    values = {}
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("whisper_diarization_pass_recordings_"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values["whisper_diarization_pass_recordings_count"], values["whisper_diarization_pass_recordings_sum"]


def test_concurrent_recordings_share_a_diarization_pass(server, conversation, diarized, load_clip):
    """Recordings that arrive while the diarizer is busy go through its next pass together (one batch through
    each model), and each gets the speakers it gets alone: its own, with its known speaker's name. (Four at once:
    the first starts a pass alone, the three behind it must share the next; two of each kind.)"""
    path, _ = conversation
    # reader 1221's other clip: one of the recording's two readers
    known = {"known_speaker_names": ["reader"],
             "known_speaker_references": [data_url(load_clip("g1_en_librispeech-test-clean_1221-135766-0002.wav"))]}
    client = server.client()

    def ask(i: int):
        return client.audio.transcriptions.create(
            file=path, model="whisper-1", response_format="diarized_json", **(known if i % 2 else {})
        )

    alone = [diarized, ask(1)]  # the plain request alone is the module's shared answer
    before = _passes(server)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, range(4)))
    passes, recordings = (a - b for a, b in zip(_passes(server), before))
    assert recordings == 4 and passes < 4, (passes, recordings)
    assert "reader" in {s.speaker for s in alone[1].segments}
    for i, body in enumerate(together):
        assert body.segments == alone[i % 2].segments, i


def test_chunking_strategy_is_honoured_with_diarized_json(server, conversation):
    """OpenAI requires chunking_strategy for diarized inputs over 30 s; we accept it (auto or server_vad) and
    label the VAD-cut transcript's segments with the same readers."""
    path, spans = conversation
    client = server.client()
    for strategy in ("auto", {"type": "server_vad", "silence_duration_ms": 300}):
        body = client.audio.transcriptions.create(
            file=path, model="whisper-1", response_format="diarized_json", chunking_strategy=strategy
        )
        assert {s.speaker for s in body.segments} == {"A", "B"}, strategy
        letters = {}
        for s in body.segments:
            assert letters.setdefault(reader_at(spans, (s.start + s.end) / 2), s.speaker) == s.speaker, (strategy, s)
        assert body.text.strip() and " ".join(s.text for s in body.segments).split() == body.text.split()
