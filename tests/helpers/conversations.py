"""Multi-speaker recordings assembled from single-speaker clips of the test clips (tests/helpers/data.py), with their true turns: what the
diarization tests and benchmarks/diarization.py measure against.

Turns of 4-15 s are cut from each speaker's audio at its quietest 100 ms near the cut and taken in turn, with
pauses of 0.2-1.5 s (seeded); the reference is each turn's speech as Silero VAD finds it, labelled with the turn's
speaker.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from tests.helpers.data import DATA

RATE = 16000

LIBRISPEECH_1688 = [f"g1_en_librispeech-test-other_1688-142285-000{i}.flac" for i in range(3)]
LIBRISPEECH_1221 = [f"g1_en_librispeech-test-clean_1221-135766-000{i}.wav" for i in (1, 2)]
SENSE = [f"g1_en_librivox_sense-and-sensibility-0{i}.wav" for i in (870, 880, 890, 920, 930)]
FOUR = {
    "ljspeech": ["g2_en_ljspeech_LJ001-0001_to_0032_concat.flac"],
    "sonnets": ["g2_en_librivox_shakespeare-sonnets-1-3_concat.mp3"],
    "reader1688": LIBRISPEECH_1688,
    "reader1221": LIBRISPEECH_1221,
}
EIGHT = {
    **FOUR,
    "sense": SENSE,
    "spontaneous": ["g1_en_spontaneous_mfa-acoustic-corpus.wav"],
    "harvard": ["g4_en_harvard-sentences_OSR_us_000_0034_8k.wav"],
    "simplicissimus": ["g3_de_librivox_simplicissimus-titlepage.mp3"],
}


def quiet_cut(audio: np.ndarray, target: int) -> int:
    """The start of the quietest 100 ms within 1 s of `target` samples (a cut between words, not inside one)."""
    frame = RATE // 10
    lo, hi = max(0, target - RATE), min(len(audio) - frame, target + RATE)
    if hi <= lo:
        return min(target, len(audio))
    starts = range(lo, hi, frame // 4)
    return min(starts, key=lambda s: float(np.square(audio[s : s + frame]).mean())) + frame // 2


@functools.lru_cache(maxsize=16)
def _speaker_audio(data: Path, files: tuple[str, ...]) -> np.ndarray:
    """One speaker's clips decoded and joined (kept: recordings of several seeds reuse them)."""
    from engine import decode_audio

    audio = np.concatenate([decode_audio(data / f) for f in files])
    audio.flags.writeable = False
    return audio


def assemble(sources: dict[str, list[str]], seconds: float, seed: int = 0, data: Path = DATA, overlap: float = 0.0):
    """(samples, [(start, end, speaker)] turns) of about `seconds`, the speakers taking turns; `overlap`: the share
    of turns that start 0.3-1.5 s before the previous one ends (the two voices mixed) instead of after a pause."""
    rng = np.random.default_rng(seed)
    audio = {name: _speaker_audio(data, tuple(files)) for name, files in sources.items()}
    offset = dict.fromkeys(audio, 0)
    placed, turns, position = [], [], 0  # (start sample, piece); the next turn's start sample
    speakers = list(audio)
    while position < seconds * RATE and any(offset[s] < len(audio[s]) - RATE for s in speakers):
        for name in speakers:
            a, start = audio[name], offset[name]
            if start >= len(a) - RATE:
                continue
            end = quiet_cut(a, start + int(rng.uniform(4, 15) * RATE))
            if len(a) - end < 2 * RATE:
                end = len(a)
            piece = a[start:end]
            offset[name] = end
            turns.append((position / RATE, (position + len(piece)) / RATE, name))
            placed.append((position, piece))
            step = len(piece) + int(rng.uniform(0.2, 1.5) * RATE)
            if overlap and rng.random() < overlap:
                step = len(piece) - min(int(rng.uniform(0.3, 1.5) * RATE), len(piece) // 2)
            position += step
            if position >= seconds * RATE:
                break
    samples = np.zeros(max(position, max(p + len(x) for p, x in placed)), dtype=np.float32)
    for p, x in placed:
        samples[p : p + len(x)] += x
    return samples, turns


def reference(samples: np.ndarray, turns, vad: VADSpans):
    """Each turn's speech regions (Silero VAD), labelled with the turn's speaker, as a pyannote Annotation."""
    from pyannote.core import Annotation, Segment

    ref = Annotation()
    for start, end, name in turns:
        piece = samples[int(start * RATE) : int(end * RATE)]
        for s, e in vad.speech_spans(piece):
            ref[Segment(start + s, start + e)] = name
    return ref


def annotation(turns):
    from pyannote.core import Annotation, Segment

    hyp = Annotation()
    for t in turns:
        hyp[Segment(t.start, t.end)] = t.speaker
    return hyp


class VADSpans:
    """Speech spans (start, end) in seconds of one piece of audio, from the engine's Silero VAD."""

    def __init__(self, vad) -> None:
        self.vad = vad

    def speech_spans(self, piece: np.ndarray) -> list[tuple[float, float]]:
        from engine import ChunkingOptions

        # no padding, and a pause of 250 ms ends a span: the reference marks speech, not the breaths around it
        options = ChunkingOptions(prefix_padding_ms=0, silence_duration_ms=250)
        return [(s / RATE, e / RATE) for s, e in self.vad.speech_spans(piece, options)]
