"""The realtime session's input audio and configuration, off the network."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from server.realtime.audio_input import AudioFormatError, InputAudio, decode_base64
from server.realtime.session import SessionConfig, SessionError


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


def test_session_update_merges_and_refuses_what_it_cannot_do():
    s = SessionConfig("tiny.en")
    assert s.turn_detection.silence_duration_ms == 500 and s.format_type == "audio/pcm"
    s.update({"type": "transcription", "audio": {"input": {"transcription": {"language": "en", "prompt": "Names."}}}})
    assert (s.language, s.prompt, s.turn_detection.threshold) == ("en", "Names.", 0.5)  # the rest kept
    s.update({"type": "transcription", "audio": {"input": {"turn_detection": None, "format": {"type": "audio/pcmu"}}}})
    assert s.turn_detection is None and s.format_type == "audio/pcmu" and s.language == "en"
    body = s.body()
    assert body["audio"]["input"]["transcription"]["model"] == "tiny.en"
    bad = [
        ({"type": "realtime"}, "session.type"),
        ({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}, "type"),
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
