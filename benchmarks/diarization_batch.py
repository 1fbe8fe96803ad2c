"""The diarizer's passes: N recordings arriving together, diarized in one pass, against the same N one at a time.

    python benchmarks/diarization_batch.py [--device cuda] [--recordings 64] [--seconds 120]

The recordings are 4-speaker conversations assembled from tests/data clips (tests/helpers/conversations.py),
one seed each, so no two are alike. "one at a time" is what a server whose diarizer takes one recording per pass
does with N concurrent requests; "one pass" is what this server's DiarizationWorker does with N requests that
arrive while it is busy: every stage over all of them (SpeakerDiarizer.diarize_many). Both use the same models
on the same device; the table gives each one's wall time, its stages' (voice activity, filterbanks, embeddings,
clustering), the audio seconds per wall second, and whether every recording got the same turns both ways.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.conversations import DATA, FOUR, RATE, assemble

STAGES = ("speech", "features", "embeddings", "clustering")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--recordings", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=120.0, help="length of each recording")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    from engine import DiarizationJob, SpeakerDiarizer

    recordings = [assemble(FOUR, args.seconds, seed=i, data=args.data)[0] for i in range(args.recordings)]
    audio = sum(len(r) for r in recordings) / RATE
    diarizer = SpeakerDiarizer(args.device)
    diarizer.diarize(recordings[0][: RATE * 20])  # load the models and warm them outside the timing

    start = time.perf_counter()
    alone, stages_alone = [], Counter()
    for r in recordings:
        alone.append(diarizer.diarize(r))
        stages_alone.update(diarizer.last_pass)
    one_by_one = time.perf_counter() - start

    start = time.perf_counter()
    together = diarizer.diarize_many([DiarizationJob(r) for r in recordings])
    one_pass = time.perf_counter() - start
    stages_together = Counter(diarizer.last_pass)

    same = sum(a == b for a, b in zip(alone, together))
    speakers = Counter(len({t.speaker for t in d.turns}) for d in together)
    print(f"{args.recordings} recordings of {args.seconds:.0f} s ({audio / 60:.0f} min of audio), {args.device}; "
          f"speakers found per recording: {dict(sorted(speakers.items()))}")  # fmt: skip
    print("| mode | wall s | " + " | ".join(f"{s} s" for s in STAGES) + " | audio s per wall s | same turns |")
    print("|---|---|" + "---|" * len(STAGES) + "---|---|")
    for mode, wall, stages in (("one at a time", one_by_one, stages_alone), ("one pass", one_pass, stages_together)):
        cells = " | ".join(f"{stages[s]:.2f}" for s in STAGES)
        print(f"| {mode} | {wall:.2f} | {cells} | {audio / wall:.0f} | {same}/{len(recordings)} |")
    print(f"one pass: {one_by_one / one_pass:.2f}x the throughput of one at a time")


if __name__ == "__main__":
    main()
