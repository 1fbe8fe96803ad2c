"""Sequential long-form (timestamps, previous-text conditioning, temperature fallback) against faster-whisper's
`WhisperModel.transcribe` with the same weights and greedy settings: the same tokens, window after window."""

import pytest

from engine.request import DecodeOptions

CLIP = "g2_en_earnings22_4482311_3-62s.wav"  # 60 s: two windows and a seek inside the audio


@pytest.mark.parametrize("model", ["tiny", "base"])
def test_long_form_tokens_equal_faster_whisper(model, request, load_clip):
    engine = request.getfixturevalue(f"{model}_engine")
    fw = request.getfixturevalue(f"{model}_fw")
    audio = load_clip(CLIP)
    ours = engine.transcribe(audio, DecodeOptions(language="en"))
    segments, _ = fw.transcribe(audio, beam_size=1, vad_filter=False, condition_on_previous_text=True, language="en")
    theirs = list(segments)
    assert [s.tokens for s in ours.segments] == [s.tokens for s in theirs]
    # the same times, except that ours never end after the audio does (faster-whisper's last may, by 20 ms)
    clamp = ours.duration
    expected = [(round(min(s.start, clamp), 3), round(min(s.end, clamp), 3)) for s in theirs]
    assert [(s.start, s.end) for s in ours.segments] == expected
    assert ours.segments[-1].end <= ours.duration
