"""Batched Silero VAD (engine/transcription/vad.py) against the silero-vad package's own frame-by-frame model and span logic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.request import ChunkingOptions
from engine.transcription.vad import VoiceActivityDetector, push_many
from tests.helpers.realtime import stream_rounds

CLIP = "g2_en_earnings22_4483589_261-321s.wav"  # 60 s of a conference call, with pauses


@pytest.fixture(scope="module")
def audio(load_clip) -> np.ndarray:
    return load_clip(CLIP)


@pytest.fixture(scope="module")
def vad() -> VoiceActivityDetector:
    return VoiceActivityDetector()


def test_loading_keeps_torch_thread_count(vad):
    num_threads = torch.get_num_threads()
    assert vad.model is vad.model  # loaded once
    assert torch.get_num_threads() == num_threads  # silero's import sets it to 1 for the whole process


def test_probabilities_match_silero_frame_by_frame(vad, audio):
    silero_vad = pytest.importorskip("silero_vad")
    clip = torch.from_numpy(audio[: 20 * 16000])
    model = silero_vad.load_silero_vad()
    model.reset_states()
    expected = [model(chunk, 16000).item() for chunk in torch.nn.functional.pad(clip, (0, -len(clip) % 512)).split(512)]
    assert np.allclose(vad.speech_probs(clip.numpy()), expected, atol=1e-4)


@pytest.mark.parametrize("options", [ChunkingOptions(), ChunkingOptions(0.3, 100, 200), ChunkingOptions(0.7, 0, 1000)])
def test_spans_match_silero_get_speech_timestamps(vad, audio, options):
    silero_vad = pytest.importorskip("silero_vad")
    expected = silero_vad.get_speech_timestamps(
        torch.from_numpy(audio),
        silero_vad.load_silero_vad(),
        threshold=options.threshold,
        min_silence_duration_ms=options.silence_duration_ms,
        speech_pad_ms=options.prefix_padding_ms,
    )
    spans = vad.speech_spans(audio, options)
    assert spans == [(s["start"], s["end"]) for s in expected]
    assert len(spans) >= 2


def test_long_speech_is_cut_under_the_limit(vad, audio):
    spans = vad.speech_spans(audio, ChunkingOptions(silence_duration_ms=5000), max_span_s=10.0)
    assert spans and all(end - start <= 10 * 16000 for start, end in spans)


def test_silence_and_empty_audio_have_no_speech(vad):
    assert vad.speech_spans(np.zeros(16000 * 5, dtype=np.float32), ChunkingOptions()) == []
    assert vad.speech_spans(np.zeros(0, dtype=np.float32), ChunkingOptions()) == []


def test_a_stream_in_pieces_gets_the_whole_audios_probabilities(audio, vad):
    """Realtime turn detection runs Silero on audio as it arrives: pieces of any size, the LSTM state carried."""
    whole = vad.speech_probs(audio[: len(audio) // 512 * 512])
    stream, got = vad.stream(), []
    rng = np.random.default_rng(0)
    start = 0
    while start < len(audio):
        size = int(rng.integers(1, 4000))
        got += stream.push(audio[start : start + size])
        start += size
    assert len(got) == len(whole) == stream.frames_done
    assert np.abs(np.array(got) - np.array(whole)).max() < 1e-5


def test_streams_pushed_together_get_what_each_gets_alone(audio, vad):
    """Live sessions' audio goes through Silero in one batch (push_many): pieces of different sizes, streams at
    different positions, some completing no frame in a round; each stream's probabilities are its own."""
    clips = [audio[i * 80_000 : (i + 1) * 80_000] for i in range(4)]  # 5 s each, different speech
    alone = [vad.stream() for _ in clips]
    together = [vad.stream() for _ in clips]
    got_alone: list[list[float]] = [[] for _ in clips]
    got_together: list[list[float]] = [[] for _ in clips]
    for pieces in stream_rounds(clips, 1):
        for i, piece in enumerate(pieces):
            got_alone[i] += alone[i].push(piece)
        for i, probs in enumerate(push_many(together, pieces)):
            got_together[i] += probs
    for a, b in zip(got_alone, got_together):
        assert len(a) == len(b) > 100
        assert np.abs(np.array(a) - np.array(b)).max() < 1e-5
