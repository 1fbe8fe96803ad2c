"""What LoRA adapters cost: windows decoded at once whose rows use 0, 1, 4 or 16 different adapters, against the
same model with no adapter support at all, in one run.

    python benchmarks/lora_cost.py [--model tiny.en] [--windows 1 8 32] [--adapters 0 1 4 16] [--ranks 16 64]

Adapters are random PEFT adapters made with peft (tests/helpers/lora.py random_adapter: q/k/v/out, fc1 and fc2 of
the encoder and the decoder, every layer), loaded with --max-loras 16. Each configuration submits N copies of one
11 s clip (one window each, so every window starts together) decoding exactly --tokens tokens (fixed_decode_tokens:
the same work whatever the adapters make the model say), round-robin over the adapters (0: the model itself, on
the engine that has adapters loaded; a count above the number of windows is skipped); the baseline is an engine with no adapters configured. Prints the median
wall time over --repeats and the throughput relative to the baseline at the same number of windows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import DecodeOptions, Engine, EngineConfig, decode_audio

CLIP = Path(__file__).resolve().parents[1] / "tests" / "data" / "g1_en_jfk.flac"


def run(engine: Engine, audio, adapters: list[str | None], windows: int, tokens: int) -> float:
    async def go() -> float:
        start = time.perf_counter()
        handles = [
            engine.submit(audio, DecodeOptions(adapter=adapters[i % len(adapters)], fixed_decode_tokens=tokens,
                                               without_timestamps=True, temperatures=(0.0,)))
            for i in range(windows)
        ]  # fmt: skip
        for handle in handles:
            await handle.result()
        return time.perf_counter() - start

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 4, 16])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    from tests.helpers.lora import random_adapter

    audio = decode_audio(CLIP)
    most = max(args.adapters)
    common = {"model": args.model, "device": "cpu", "dtype": args.dtype, "max_num_seqs": max(args.windows)}
    baseline = Engine(EngineConfig(**common))
    baseline.start()
    rows = []
    for rank in args.ranks:
        loras = tuple((f"r{rank}-{i}", str(random_adapter(args.model, rank=rank, seed=i))) for i in range(most))
        engine = Engine(EngineConfig(**common, loras=loras, max_loras=max(most, 1)))
        engine.start()
        run(engine, audio, [None], 1, 4)  # warm-up
        for windows in args.windows:
            base_s = statistics.median(run(baseline, audio, [None], windows, args.tokens) for _ in range(args.repeats))
            for count in args.adapters:
                if count > windows:  # the rows could not use that many
                    continue
                names = [name for name, _ in loras[:count]] or [None]
                took = statistics.median(run(engine, audio, names, windows, args.tokens) for _ in range(args.repeats))
                rows.append((rank, windows, count, base_s, took))
                print(f"rank {rank}, {windows} windows, {count} adapters: {took:.3f} s (model alone {base_s:.3f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
        engine.shutdown()
    baseline.shutdown()
    print(f"\n{args.model}, {args.tokens} tokens a window, dtype {args.dtype}; throughput relative to the model alone")
    print("| rank | windows | adapters in the batch | s | model alone, s | relative throughput |")
    print("|---|---|---|---|---|---|")
    for rank, windows, count, base_s, took in rows:
        print(f"| {rank} | {windows} | {count} | {took:.3f} | {base_s:.3f} | {base_s / took:.2f}x |")


if __name__ == "__main__":
    main()
