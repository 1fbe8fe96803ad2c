"""Language detection with multilingual base: the engine's pick equals faster-whisper's on every g3_* clip.

Whisper detects the language on the first 30 s window. The one-window clips' languages are those of the greedy
base transcripts that test_parity_faster_whisper.py compares (both sides detect it on the clip's one window before
any text token; the session's caches hold them, so each side runs once per clip); here every one of them must
agree, where that test lets an unsure pick (faster-whisper's probability below 0.5) differ. The longer clips get
their first 30 s on both sides (faster-whisper's `detect_language(audio)` trims to that itself), and the engine's
request decodes a single text token: the language token comes before it, so the rest of the transcript would not
change the answer, only the test's runtime.
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
    base_engine, base_fw, g3_rows, short_clips, load_clip, base_transcripts, base_references
):
    short = [row["file"] for row in short_clips if row["file"].startswith("g3_")]
    longer = {row["file"]: load_clip(row["file"])[:N_SAMPLES] for row in g3_rows if row["file"] not in short}
    assert short and longer
    ours = {name: result.language for name, result in base_transcripts(short).items()}
    theirs = {name: (ref.language, ref.language_probability) for name, ref in base_references(short).items()}
    ours.update({name: result.language for name, result in submit_all(base_engine, longer, DETECT_ONLY).items()})
    for name, audio in longer.items():
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
