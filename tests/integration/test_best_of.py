"""best_of: a fallback attempt above temperature 0 draws several samples side by side and keeps the likeliest."""

from __future__ import annotations

from engine import DecodeOptions

HARD = "g1_en_librispeech-test-other_1688-142285-0000.flac"  # read poetry: tiny.en's samples at T=1 differ


def test_best_of_is_reproducible_alone_or_batched_and_likelier(tiny_engine, load_clip):
    audio = load_clip(HARD)
    sampled = DecodeOptions(temperatures=(1.0,), seed=3)
    best = DecodeOptions(temperatures=(1.0,), seed=3, best_of=5)
    alone = tiny_engine.transcribe(audio, best)
    together = [tiny_engine.submit(audio, best) for _ in range(3)] + [tiny_engine.submit(audio, sampled)]
    results = [h.wait(timeout=300) for h in together]
    assert all(r.text == alone.text for r in results[:3])  # each sample draws from its own seeded generator
    singles = [tiny_engine.transcribe(audio, DecodeOptions(temperatures=(1.0,), seed=s)) for s in range(4)]
    mean = sum(s.segments[0].avg_logprob for s in singles) / len(singles)
    assert alone.segments[0].avg_logprob > mean  # the likeliest of five beats a single draw's average
    assert alone.segments[0].temperature == 1.0


def test_greedy_decoding_ignores_best_of(tiny_engine, load_clip):
    audio = load_clip("g1_en_jfk.flac")
    assert tiny_engine.transcribe(audio, DecodeOptions(best_of=5)).text == tiny_engine.transcribe(audio).text
