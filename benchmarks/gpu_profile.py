"""Where a GPU engine step spends its time: CUDA kernel time by kind, and the host side for one window.

    python benchmarks/gpu_profile.py --model large-v3 --tokenizer <multilingual tokenizer.json> --concurrency 1 256

Dummy weights, float16, random 30 s windows, exactly --tokens tokens per window. For each concurrency: wall time
and RTFx of one run, then a profiled run whose CUDA kernels are grouped (GEMM, attention, copies, ...) with their
share of the wall time (--top N: also the N kernels with the most time); with --host, the wall time of each
engine-loop phase for --host-concurrency windows (default one: encoder, prompt, graph replay, logit rules, sampling
and the wait for the step's tokens).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.request import DecodeOptions  # noqa: E402
from engine_phases import print_engine_phases  # noqa: E402

KINDS = (
    ("gemm", ("gemm", "sm90", "cutlass", "xmma", "nvjet")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("copy/index", ("copy", "index", "scatter", "gather", "cat")),
    ("quantize", ("quantize",)),
    ("norm", ("norm",)),
    ("elementwise", ("elementwise", "vectorized")),
    ("reduce/softmax", ("reduce", "softmax", "argmax")),
)


def kind_of(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, keys in KINDS if any(k in lower for k in keys)), "other")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="large-v3")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for dummy multilingual models")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 256])
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--host", action="store_true", help="also print the engine loop's phases for one window")
    ap.add_argument("--host-concurrency", type=int, default=1, help="windows per request batch for --host")
    ap.add_argument("--top", type=int, default=0, help="also list the N kernels with the most GPU time")
    ap.add_argument("--encoder-precision", default="model", choices=["model", "float8"])
    args = ap.parse_args()

    engine = Engine(EngineConfig(model=args.model, dummy_weights=True, device="cuda", dtype="float16",
                                 tokenizer=args.tokenizer, encoder_precision=args.encoder_precision))
    engine.start()
    options = DecodeOptions(language="en", without_timestamps=True, temperatures=(0.0,), fixed_decode_tokens=args.tokens,
                            no_speech_threshold=None, log_prob_threshold=None, compression_ratio_threshold=None)
    audio = (np.random.default_rng(0).standard_normal(480_000) * 0.1).astype(np.float32)

    def run(n: int) -> float:
        start = time.perf_counter()
        for handle in [engine.submit(audio, options) for _ in range(n)]:
            handle.wait(timeout=600)
        return time.perf_counter() - start

    run(1)  # warm-up
    for n in args.concurrency:
        run(n)
        wall = run(n)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            profiled = run(n)
        total, by_kind, count = 0.0, collections.Counter(), collections.Counter()
        by_name, name_count = collections.Counter(), collections.Counter()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                us = event.device_time_total
                total += us
                by_kind[kind_of(event.name)] += us
                count[kind_of(event.name)] += 1
                by_name[event.name] += us
                name_count[event.name] += 1
        print(f"\n{args.model}, {n} windows: {wall:.3f} s, RTFx {30 * n / wall:.0f}; profiled run {profiled:.3f} s, "
              f"kernels busy {total / 1e6 / profiled:.0%} of it")
        print("| kind | ms | kernels | share of kernel time |")
        print("|---|---|---|---|")
        for kind, us in by_kind.most_common():
            print(f"| {kind} | {us / 1e3:.1f} | {count[kind]} | {us / total:.0%} |")
        if args.top:
            print("| kernel | ms | calls | us per call |")
            print("|---|---|---|---|")
            for name, us in by_name.most_common(args.top):
                print(f"| {name[:100]} | {us / 1e3:.1f} | {name_count[name]} | {us / name_count[name]:.1f} |")
    if args.host:
        n = args.host_concurrency
        print_engine_phases(engine, lambda: run(n), f"{args.model}, {n} window(s)")
    engine.shutdown()


if __name__ == "__main__":
    main()
