"""One long request decoded sequentially (Whisper's algorithm) against chunked mode (VAD windows in parallel).

    python benchmarks/chunked_vs_sequential.py --model tiny.en --minutes 10 [--device cuda]

The recording is built as in longform_batching.py; both modes run on the same engine, each twice (the first
is a warm-up), and the script prints wall time, RTFx and the speed ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data")
    args = ap.parse_args()

    from longform_batching import build_recording

    from engine import DecodeOptions, Engine, EngineConfig
    from engine.request import ChunkingOptions

    audio = build_recording(args.data, args.minutes)
    seconds = len(audio) / 16000
    engine = Engine(EngineConfig(model=args.model, device=args.device))
    engine.start()
    modes = {"sequential": DecodeOptions(language="en"),
             "chunked (VAD)": DecodeOptions(language="en", chunking=ChunkingOptions())}  # fmt: skip
    times = {}
    for name, options in modes.items():
        engine.transcribe(audio, options)  # warm-up (and the VAD model's first load)
        start = time.perf_counter()
        engine.transcribe(audio, options)
        times[name] = time.perf_counter() - start
    engine.shutdown()
    print(f"\n{args.model} on {engine.runner.device}, one request of {seconds / 60:.1f} min")
    print("| mode | wall s | RTFx |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t:.2f} | {seconds / t:.0f} |")
    print(f"\nchunked is {times['sequential'] / times['chunked (VAD)']:.1f}x faster")


if __name__ == "__main__":
    main()
