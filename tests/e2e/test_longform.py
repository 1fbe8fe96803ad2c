"""Long-form (~2.6 min, six 30 s windows) through the real server and SDK: WER close to faster-whisper's.

The reference system is faster-whisper's sequential `WhisperModel.transcribe` on the same tiny.en weights with the
same greedy settings (beam 1, the default temperature fallback, no VAD, conditioned on the previous text).
Both transcripts and the reference pass through the same normalizer.
"""

from __future__ import annotations

import pytest
from openai.types.audio import TranscriptionVerbose

from tests.helpers.transcripts import normalize_text

CLIP = "g2_en_librivox_shakespeare-sonnets-1-3_concat.mp3"  # 158 s, LibriVox reading, Gutenberg text
MAX_WER_GAP = 0.02  # two WER points
END_SLACK_S = 0.5  # segment ends are timestamp tokens (20 ms steps); the last may round past the audio's end


def wer(reference: str, hypothesis: str) -> float:
    jiwer = pytest.importorskip("jiwer")
    return jiwer.wer(normalize_text(reference), normalize_text(hypothesis))


@pytest.fixture(scope="module")
def faster_whisper_text(data_dir) -> str:
    WhisperModel = pytest.importorskip("faster_whisper").WhisperModel

    from engine.audio.uploads import decode_audio
    from engine.model.weights import resolve_model

    model = WhisperModel(
        str(resolve_model("tiny.en").config_dir), device="cpu", compute_type="float32", cpu_threads=2
    )
    segments, _ = model.transcribe(
        decode_audio(data_dir / CLIP),
        language="en",
        beam_size=1,
        vad_filter=False,
        condition_on_previous_text=True,
    )
    return " ".join(segment.text.strip() for segment in segments)


@pytest.mark.slow
def test_longform_wer_matches_faster_whisper(server, data_dir, manifest, faster_whisper_text):
    reference = (data_dir / CLIP).with_suffix(".txt").read_text(encoding="utf-8").strip()
    duration = next(float(row["duration_s"]) for row in manifest if row["file"] == CLIP)

    result = server.client().audio.transcriptions.create(
        file=data_dir / CLIP, model="whisper-1", response_format="verbose_json"
    )
    assert isinstance(result, TranscriptionVerbose)
    assert result.duration == pytest.approx(duration, abs=0.05)

    # Segments: in order, non-overlapping, inside the audio, and spread over all of it (every window decoded).
    segments = result.segments
    assert len(segments) >= 6, len(segments)
    for i, segment in enumerate(segments):
        assert 0.0 <= segment.start < segment.end <= duration + END_SLACK_S, (i, segment.start, segment.end)
        if i:
            assert segment.start >= segments[i - 1].end - 1e-6, (i, segments[i - 1].end, segment.start)
    assert segments[-1].end > duration - 30.0, (segments[-1].end, duration)
    assert normalize_text(result.text) == normalize_text(" ".join(s.text for s in segments))

    ours = wer(reference, result.text)
    theirs = wer(reference, faster_whisper_text)
    print(f"\n{CLIP} ({duration:.1f} s), tiny.en greedy: WER server {ours:.2%}, faster-whisper {theirs:.2%}")
    assert ours <= theirs + MAX_WER_GAP, f"server WER {ours:.2%} vs faster-whisper {theirs:.2%}\n{result.text}"
