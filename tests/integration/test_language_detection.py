"""Language detection with multilingual base: the engine's pick equals faster-whisper's on every g3_* clip.

Whisper detects the language on the first 30 s window, so both sides get the clip's first 30 s (faster-whisper's
`detect_language(audio)` trims to that itself). The engine's request decodes a single text token: the language
token comes before it, so the rest of the transcript would not change the answer, only the test's runtime.
"""

from __future__ import annotations

import pytest

from engine.audio.constants import N_SAMPLES
from engine.request import DecodeOptions
from tests.helpers.engine_runs import submit_all

DETECT_ONLY = DecodeOptions(temperatures=(0.0,), without_timestamps=True, fixed_decode_tokens=1)


@pytest.fixture(scope="module")
def g3_audios(manifest, load_clip):
    names = [row["file"] for row in manifest if row["file"].startswith("g3_")]
    assert len(names) >= 20
    return {name: load_clip(name)[:N_SAMPLES] for name in names}


def test_detected_language_matches_faster_whisper_on_every_g3_clip(base_engine, base_fw, g3_audios):
    ours = submit_all(base_engine, g3_audios, DETECT_ONLY)
    lines, wrong = [], []
    for name, audio in g3_audios.items():
        language, probability, _ = base_fw.detect_language(audio)
        got = ours[name].language
        lines.append(f"  {name}: engine {got}, faster-whisper {language} (p={probability:.2f})")
        if got != language:
            wrong.append(lines[-1])
    print(f"\nbase language detection, {len(g3_audios)} clips:\n" + "\n".join(lines))
    assert not wrong, "\n".join(wrong)
