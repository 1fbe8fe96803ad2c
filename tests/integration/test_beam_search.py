"""Beam search in the shared batch: faster-whisper's beam_size=5 tokens, the same beams alone or batched beside
greedy requests, and beams with timestamps, word timestamps, long-form seeking and language detection.
(benchmarks/beam_search.py runs the parity on every clip.)"""

from __future__ import annotations

import pytest

from engine import DecodeOptions, InvalidRequestError
from tests.helpers.engine_runs import GREEDY, submit_all, tokens_of

BEAM = DecodeOptions(without_timestamps=True, temperatures=(0.0,), beam_size=5)
# clips where tiny.en's beam-5 transcript differs from its greedy one, and two where it does not
CLIPS = (
    "g1_en_jfk.flac",
    "g1_en_librispeech-test-other_1688-142285-0000.flac",
    "g1_en_spontaneous_mfa-acoustic-corpus.wav",
    "g1_en_whispered_mfa-whisper.flac",
)
LONG = "g2_en_earnings22_4482311_3-62s.wav"


def fw_beam_tokens(fw, audio) -> list[int]:
    segments, _ = fw.transcribe(audio, beam_size=5, temperature=0, without_timestamps=True, vad_filter=False)
    return [t for s in segments for t in s.tokens]


def test_beams_equal_faster_whisper_and_do_not_depend_on_the_batch(tiny_engine, tiny_fw, load_clip):
    audios = {name: load_clip(name) for name in CLIPS}
    lone = {name: tiny_engine.transcribe(audio, BEAM) for name, audio in audios.items()}
    for name, audio in audios.items():
        assert tokens_of(lone[name]) == fw_beam_tokens(tiny_fw, audio), name
    # all at once, each beside greedy decodes of the other clips: the same tokens and scores
    handles = {name: tiny_engine.submit(audio, BEAM) for name, audio in audios.items()}
    greedy = submit_all(tiny_engine, audios, GREEDY)
    batched = {name: h.wait(timeout=600) for name, h in handles.items()}
    for name in CLIPS:
        assert tokens_of(batched[name]) == tokens_of(lone[name]), name
        assert batched[name].segments[0].avg_logprob == pytest.approx(lone[name].segments[0].avg_logprob, abs=1e-4)
    assert any(tokens_of(greedy[n]) != tokens_of(lone[n]) for n in CLIPS)  # the beams did search


def test_long_form_beams_with_word_timestamps(tiny_engine, tiny_fw, load_clip):
    """Timestamps, seeking, previous-text conditioning and word timestamps, with beams: faster-whisper's
    transcribe(beam_size=5) segments, and words inside them."""
    audio = load_clip(LONG)
    ours = tiny_engine.transcribe(audio, DecodeOptions(language="en", beam_size=5, word_timestamps=True))
    segments, _ = tiny_fw.transcribe(audio, beam_size=5, vad_filter=False, language="en", word_timestamps=True)
    segments = list(segments)
    assert [s.tokens for s in ours.segments] == [s.tokens for s in segments]
    words = [w for s in ours.segments for w in s.words]
    theirs = [w for s in segments for w in s.words]
    assert [w.word for w in words] == [w.word for w in theirs] and len(words) > 80
    # the same alignment (float32 cross-attention weights and a median filter: equal to within one 20 ms frame)
    assert all(abs(a.start - b.start) <= 0.021 and abs(a.end - b.end) <= 0.021 for a, b in zip(words, theirs))


def test_language_detection_and_multilingual_beams(base_engine, base_fw, load_clip):
    name = "g3_de_librivox_simplicissimus-titlepage.mp3"
    audio = load_clip(name)[: 16000 * 25]
    ours = base_engine.transcribe(audio, BEAM)
    assert ours.language == "de"
    assert tokens_of(ours) == fw_beam_tokens(base_fw, audio)


def test_more_beams_than_slots_is_refused(tiny_engine, load_clip, monkeypatch):
    """A window's beams must fit in the slots together, or it would wait for ever."""
    monkeypatch.setattr(tiny_engine, "num_slots", 4)
    with pytest.raises(InvalidRequestError, match="beam_size"):
        tiny_engine.submit(load_clip("g1_en_jfk.flac"), DecodeOptions(beam_size=5))
