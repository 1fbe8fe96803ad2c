"""Language detection with multilingual base: the engine's pick equals faster-whisper's on every g3_* clip.

Whisper detects the language on the first 30 s window. Where test_parity_faster_whisper.py compares a clip's greedy
base transcripts (`base_parity_clips`), their languages are read from them (both sides detect it on the clip's one
window before any text token; the session's caches hold them, so each side runs once per clip); here every one of
them must agree, where that test lets an unsure pick (faster-whisper's probability below 0.5) differ. Every other
clip gets its first 30 s on both sides (faster-whisper's `detect_language(audio)` trims to that itself), and the
engine's request decodes a single text token: the language token comes before it, so the rest of the transcript would
not change the answer, only the test's runtime.
"""

from __future__ import annotations

import pytest

from engine.audio.constants import N_SAMPLES
from engine.request import DecodeOptions
from tests.helpers.engine_runs import submit_all

DETECT_ONLY = DecodeOptions(temperatures=(0.0,), without_timestamps=True, fixed_decode_tokens=1)


@pytest.fixture(scope="module")
def g3_rows(manifest):
    rows = [row for row in manifest if row["file"].startswith("g3_")]
    assert len(rows) >= 20
    return rows


def test_detected_language_matches_faster_whisper_on_every_g3_clip(
    base_engine, base_fw, g3_rows, load_clip, base_parity_clips, base_transcripts, base_references
):
    transcribed = [row["file"] for row in g3_rows if row["file"] in base_parity_clips]
    detected = {row["file"]: load_clip(row["file"])[:N_SAMPLES] for row in g3_rows if row["file"] not in transcribed}
    assert len(transcribed) >= 8 and len(detected) >= 8
    ours = {name: result.language for name, result in base_transcripts(transcribed).items()}
    theirs = {name: (ref.language, ref.language_probability) for name, ref in base_references(transcribed).items()}
    ours.update({name: result.language for name, result in submit_all(base_engine, detected, DETECT_ONLY).items()})
    for name, audio in detected.items():
        language, probability, _ = base_fw.detect_language(audio)
        theirs[name] = (language, probability)
    lines, wrong = [], []
    for name in [row["file"] for row in g3_rows]:
        (language, probability), got = theirs[name], ours[name]
        lines.append(f"  {name}: engine {got}, faster-whisper {language} (p={probability:.2f})")
        if got != language:
            wrong.append(lines[-1])
    print(f"\nbase language detection, {len(g3_rows)} clips:\n" + "\n".join(lines))
    assert not wrong, "\n".join(wrong)
