"""Word timestamps from the batched engine against faster-whisper's word_timestamps=True (tiny.en, CPU)."""

import numpy as np
import pytest

from engine.request import DecodeOptions

CLIPS = [
    "g1_en_jfk.flac",
    "g1_en_librispeech-dev-clean_1272-128104-0000.wav",
    "g1_en_librispeech-dev-clean_2412-153948-0000.flac",
    "g1_en_librispeech-test-clean_1089-134686-0001.wav",
    "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "g1_en_librispeech-test-other_1688-142285-0000.flac",
]


@pytest.fixture(scope="module")
def both(tiny_engine, tiny_fw, load_clip):
    audios = {name: load_clip(name) for name in CLIPS}
    handles = {name: tiny_engine.submit(a, DecodeOptions(word_timestamps=True)) for name, a in audios.items()}
    ours = {name: h.wait(timeout=300) for name, h in handles.items()}  # decoded together in one batch
    theirs = {}
    for name, audio in audios.items():
        segments, _ = tiny_fw.transcribe(audio, beam_size=1, word_timestamps=True, vad_filter=False)
        theirs[name] = [w for s in segments for w in s.words]
    return ours, theirs


@pytest.mark.parametrize("name", CLIPS)
def test_words_match_faster_whisper(both, name):
    ours, theirs = both
    words = [w for s in ours[name].segments for w in s.words]
    assert [w.word for w in words] == [w.word for w in theirs[name]]
    diffs = [abs(a.start - b.start) for a, b in zip(words, theirs[name])]
    diffs += [abs(a.end - b.end) for a, b in zip(words, theirs[name])]
    print(f"{name}: {len(words)} words, median |diff| {np.median(diffs):.3f} s, max {max(diffs):.3f} s")
    assert np.median(diffs) <= 0.1


@pytest.mark.parametrize("name", CLIPS)
def test_every_word_inside_its_segment(both, name):
    for segment in both[0][name].segments:
        assert segment.words, segment.text
        for w in segment.words:
            assert segment.start <= w.start <= w.end <= segment.end, (segment, w)
