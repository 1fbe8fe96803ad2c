"""The int8 cross-attention cache (cross_cache_dtype="int8") keeps the transcripts of the model-dtype cache.

On a CPU the int8 cache is read through the reference path (dequantize, then SDPA); the GPU kernel is checked
against that path in tests/gpu/test_int8_cross_attention.py, so together they tie the kernel to these tokens."""

import jiwer
import pytest
import torch

from engine.config import EngineConfig
from engine.kernels.int8_attention import dequantize, quantize
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.engine_runs import submit_all, tokens_of
from tests.helpers.transcripts import normalize_english

CLIPS = 5  # a spread of the short English clips: enough to see a systematic change, cheap enough for CI


@pytest.fixture(scope="module")
def int8_engine(tiny_engine):  # tiny_engine skips when the weights are missing
    engine = Engine(EngineConfig(model="tiny.en", device="cpu", cross_cache_dtype="int8"))
    engine.start()
    yield engine
    engine.shutdown()


def test_quantize_round_trip_is_within_half_a_step():
    x = torch.randn(3, 5, 1500, 64) * torch.logspace(-3, 2, 64)  # vectors of very different magnitudes
    values, scale = quantize(x)
    assert values.dtype == torch.int8 and scale.shape == x.shape[:-1]
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    # half a step from rounding; the bfloat16 scale (8-bit mantissa) may clip the largest element by a quarter more
    assert ((dequantize(values, scale, torch.float32) - x).abs() <= 0.75 * step).all()
    assert ((dequantize(values, scale, torch.float32) - x).abs() <= 0.5 * step * 1.01).float().mean() > 0.99


def test_int8_cross_cache_keeps_the_tokens(tiny_engine, int8_engine, short_english_clips, load_clip):
    assert int8_engine.runner.cache.cross_k.dtype == torch.int8
    rows = short_english_clips[:: max(1, len(short_english_clips) // CLIPS)][:CLIPS]
    audios = {row["file"]: load_clip(row["file"]) for row in rows}
    # submitted together: sequences finish at different steps, so slots (and their scales) are moved
    ours, reference = submit_all(int8_engine, audios), submit_all(tiny_engine, audios)
    # The int8 values are rounded, so a word at a near-tie may flip; which one depends on the CPU's float paths
    # (AVX-512: the sonnet clip's "increase" becomes "and crease"; AVX2: none). A systematic change would show on
    # several clips or as more than a word or two.
    changed = [name for name in audios if tokens_of(ours[name]) != tokens_of(reference[name])]
    assert len(changed) <= 1, changed
    for name in changed:
        edits = jiwer.process_words(normalize_english(reference[name].text), normalize_english(ours[name].text))
        assert edits.substitutions + edits.deletions + edits.insertions <= 2, (name, ours[name].text)


def test_int8_cross_cache_word_timestamps(tiny_engine, int8_engine, load_clip):
    audio = load_clip("g1_en_jfk.flac")
    options = DecodeOptions(word_timestamps=True, temperatures=(0.0,))
    ours, reference = int8_engine.transcribe(audio, options), tiny_engine.transcribe(audio, options)
    words = [w for s in ours.segments for w in s.words]
    ref_words = [w for s in reference.segments for w in s.words]
    assert [w.word for w in words] == [w.word for w in ref_words]
    assert max(abs(a.start - b.start) for a, b in zip(words, ref_words)) <= 0.1
    # where a word is followed by a pause, its end is where the alignment path leaves it, which small changes
    # in the attention can move (jfk: " you" before the pause ends at 8.06 s or 7.54 s): most ends must agree
    moved = sum(abs(a.end - b.end) > 0.1 for a, b in zip(words, ref_words))
    assert moved <= len(words) // 10, moved
