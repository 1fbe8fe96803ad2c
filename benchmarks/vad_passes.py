"""Silero's pass over many live streams (engine/transcription/vad.py push_many), each given a microphone's 100 ms,
on one thread and on more: what one pass of Silero's process costs at N open microphones.

    python benchmarks/vad_passes.py [--streams 256 1000] [--threads 1 2] [--passes 8]

Prints the median pass (after two warm-up passes) per streams and threads; a pass longer than 100 ms cannot keep up
with the audio it covers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.transcription.vad import SileroVAD, SpeechStream, push_many


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, nargs="+", default=[256, 1000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--passes", type=int, default=8)
    args = ap.parse_args()
    model, rng = SileroVAD.from_package(), np.random.default_rng(0)
    print("| streams | threads | median pass ms |\n|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n in args.streams:
            streams, times = [SpeechStream(model) for _ in range(n)], []
            for _ in range(args.passes + 2):
                audio = [rng.standard_normal(1600).astype(np.float32) * 0.1 for _ in range(n)]
                start = time.perf_counter()
                push_many(streams, audio)
                times.append((time.perf_counter() - start) * 1000)
            print(f"| {n} | {threads} | {statistics.median(times[2:]):.1f} |")


if __name__ == "__main__":
    main()
