"""Word error rate of tiny.en on the LibriSpeech clips: ours within a point of faster-whisper's."""

from __future__ import annotations

import jiwer

from tests.helpers.transcripts import normalize_english

MAX_WER_GAP = 0.01  # one percentage point
MAX_WER = 0.15  # tiny.en's published LibriSpeech WER is ~5.6 % (test-clean) and ~15 % (test-other)


def test_normalize_english():
    assert (
        normalize_english("Mr. Hale's 21 cold-hearted   DOGS, isn’t it?")
        == "mister hales twenty one cold hearted dogs isnt it"
    )
    assert normalize_english("In 1,961 ways: 100%!") == "in one thousand nine hundred sixty one ways one hundred"
    assert normalize_english("Café") == "cafe"


def test_librispeech_wer_matches_faster_whisper(short_english_clips, tiny_transcripts, tiny_references):
    rows = [row for row in short_english_clips if "librispeech" in row["file"]]
    assert len(rows) >= 10
    names = [row["file"] for row in rows]
    ours, theirs = tiny_transcripts(names), tiny_references(names)
    references = [normalize_english(row["reference_text"]) for row in rows]
    our_wer = jiwer.wer(references, [normalize_english(ours[name].text) for name in names])
    their_wer = jiwer.wer(references, [normalize_english(theirs[name].text) for name in names])
    print(f"\ntiny.en WER on {len(rows)} LibriSpeech clips: engine {our_wer:.2%}, faster-whisper {their_wer:.2%}")
    assert abs(our_wer - their_wer) <= MAX_WER_GAP
    assert our_wer <= MAX_WER
