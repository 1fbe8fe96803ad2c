"""Where a GPU engine step spends its time: CUDA kernel time by kind, and the host side for one window.

    python benchmarks/gpu_profile.py --model large-v3 --tokenizer <multilingual tokenizer.json> --concurrency 1 256

Dummy weights, float16, random 30 s windows, exactly --tokens tokens per window. For each concurrency: wall time
and RTFx of one run, then a profiled run whose CUDA kernels are grouped (GEMM, attention, copies, ...) with their
share of the wall time (--top N: also the N kernels with the most time); with --host, the wall time of each
engine-loop phase for --host-concurrency windows (default one: encoder, prompt, graph replay, logit rules, sampling
and the wait for the step's tokens); with --loras N, the windows take N random adapters round-robin; with --gaps,
the GPU's idle time in a run of the largest concurrency (no kernel or copy running on any stream), split by the
engine-loop phase the host was in meanwhile: what starves it. Each concurrency also prints its encoder passes: how
many, their windows and how many adapters each held.
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

from engine_phases import print_engine_phases, wrapped_phases  # noqa: E402

from engine.config import EngineConfig  # noqa: E402
from engine.kernels.options import KernelOptions  # noqa: E402
from engine.request import DecodeOptions  # noqa: E402
from engine.runtime.engine import Engine  # noqa: E402

KINDS = (  # first match wins: cuDNN's attention kernels name their architecture too ("sdpa_sm90")
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "attend")),
    ("gemm", ("gemm", "sm90", "cutlass", "xmma", "nvjet")),
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
    ap.add_argument("--gaps", action="store_true", help="also split the GPU's idle time by the host's engine phase")
    ap.add_argument("--encoder-precision", default="model", choices=["model", "float8"])
    ap.add_argument("--batch-invariant", action="store_true", help="the batch-invariant kernels (KernelOptions)")
    ap.add_argument("--loras", type=int, default=0, help="random LoRA adapters the windows take round-robin")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--switch-interval-ms", type=float, default=0.5,
                    help="Python's thread switch interval, as `serve` and the engine process set it (its default: 5)")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000)

    config = EngineConfig(model=args.model, dummy_weights=True, device="cuda", dtype="float16",
                          tokenizer=args.tokenizer, encoder_precision=args.encoder_precision,
                          max_waiting=max(256, *args.concurrency),
                          kernels=KernelOptions(batch_invariant=args.batch_invariant))
    if args.loras:
        config = with_random_loras(config, args.loras, args.lora_rank)
    engine = Engine(config)
    engine.start()
    options = [
        DecodeOptions(language="en", without_timestamps=True, temperatures=(0.0,), fixed_decode_tokens=args.tokens,
                      no_speech_threshold=None, log_prob_threshold=None, compression_ratio_threshold=None,
                      adapter=name)
        for name in [name for name, _ in config.loras] or [None]
    ]  # fmt: skip
    audio = (np.random.default_rng(0).standard_normal(480_000) * 0.1).astype(np.float32)

    def run(n: int) -> float:
        start = time.perf_counter()
        for handle in [engine.submit(audio, options[i % len(options)]) for i in range(n)]:
            handle.wait(timeout=600)
        return time.perf_counter() - start

    passes: list[tuple[int, int]] = []  # each encoder pass: its windows, and their adapters (None counts as one)
    encode = engine.runner.encode_into_slots

    def counted(mels, cross_slots, adapters=None):
        passes.append((len(mels), len(set(adapters or [None]))))
        return encode(mels, cross_slots, adapters)

    engine.runner.encode_into_slots = counted
    run(1)  # warm-up
    for n in args.concurrency:
        run(n)
        passes.clear()
        wall = run(n)
        sizes, mixes = sorted(w for w, _ in passes), sorted(a for _, a in passes)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            profiled = run(n)
        total, by_kind, count = 0.0, collections.Counter(), collections.Counter()
        by_name, name_count, spans = collections.Counter(), collections.Counter(), []
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                us = event.device_time_total
                spans.append((event.time_range.start, event.time_range.end))
                total += us
                by_kind[kind_of(event.name)] += us
                count[kind_of(event.name)] += 1
                by_name[event.name] += us
                name_count[event.name] += 1
        # kernels launched as programmatic dependents overlap the one before them: busy is the union of their spans
        busy = sum(end - start for start, end in merged(spans))
        print(f"\n{args.model}, {n} windows: {wall:.3f} s, RTFx {30 * n / wall:.0f}; profiled run {profiled:.3f} s, "
              f"kernels busy {busy / 1e6 / profiled:.0%} of it (their times add up to {total / 1e6 / profiled:.0%})")
        print(f"encoder passes: {len(sizes)}, windows a pass median {sizes[len(sizes) // 2]} (range {sizes[0]}-"
              f"{sizes[-1]}), adapters a pass median {mixes[len(mixes) // 2]} (most {mixes[-1]})")
        print("| kind | ms | kernels | share of kernel time |")
        print("|---|---|---|---|")
        for kind, us in by_kind.most_common():
            print(f"| {kind} | {us / 1e3:.1f} | {count[kind]} | {us / total:.0%} |")
        if args.top:
            print("| kernel | ms | calls | us per call |")
            print("|---|---|---|---|")
            for name, us in by_name.most_common(args.top):
                print(f"| {name[:100]} | {us / 1e3:.1f} | {name_count[name]} | {us / name_count[name]:.1f} |")
    if args.gaps:
        print_idle_gaps(engine, run, max(args.concurrency), args.model)
    if args.host:
        n = args.host_concurrency
        print_engine_phases(engine, lambda: run(n), f"{args.model}, {n} window(s)")
    engine.shutdown()


def with_random_loras(config: EngineConfig, count: int, rank: int) -> EngineConfig:
    """`config` serving `count` random adapters of `rank` (tests/helpers/lora.py random_peft_files) on every
    product."""
    import dataclasses
    import tempfile

    from engine.model.dims import DUMMY_DIMS
    from tests.helpers.lora import random_peft_files

    scratch = Path(tempfile.mkdtemp(prefix="gpu-profile-lora-"))
    dims = DUMMY_DIMS[config.model]
    loras = tuple((f"r{rank}-{i}", str(random_peft_files(dims, rank, i, scratch / str(i)))) for i in range(count))
    return dataclasses.replace(config, loras=loras, max_loras=count, max_lora_rank=rank)


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def idle_by_phase(
    busy: list[tuple[float, float]], phases: list[tuple[float, float, str]], start: float, end: float
) -> tuple[collections.Counter, collections.Counter]:
    """Idle time of the device within [start, end] (outside every `busy` interval), split by the innermost host
    phase running meanwhile ("outside any phase" where none is). Phases must nest (one thread's calls).
    Returns (microseconds per phase, gaps per phase)."""
    idle_us, gaps = collections.Counter(), collections.Counter()
    cursor = start
    holes = []
    for a, b in merged(busy):
        if b <= start or a >= end:
            continue
        if a > cursor:
            holes.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < end:
        holes.append((cursor, end))
    phases = sorted(phases)
    for a, b in holes:
        cuts = sorted({a, b, *(t for p0, p1, _ in phases for t in (p0, p1) if a < t < b)})
        seen = set()
        for c0, c1 in zip(cuts, cuts[1:]):
            mid = (c0 + c1) / 2
            active = [(p0, name) for p0, p1, name in phases if p0 <= mid < p1]
            name = max(active)[1] if active else "outside any phase"
            idle_us[name] += c1 - c0
            seen.add(name)
        for name in seen:
            gaps[name] += 1
    return idle_us, gaps


def print_idle_gaps(engine, run, n: int, model: str) -> None:
    """One profiled run of n windows with every engine-loop phase labelled; the device's idle time by phase."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.autograd.profiler import record_function

    # the engine loop runs on a thread of its own, which the profiler only sees when told to watch every thread
    every_thread = _ExperimentalConfig(profile_all_threads=True)
    with wrapped_phases(engine, record_function) as labels:
        run(n)  # warm-up with the labels in place
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], experimental_config=every_thread) as prof:
            with record_function("run"):
                wall = run(n)
    labels = set(labels)
    events = prof.events()
    busy = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    span = next(e.time_range for e in events if e.name == "run")
    steps = [e for e in events if e.name == "Engine.step"]
    loop = collections.Counter(e.thread for e in steps).most_common(1)[0][0]
    phases = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.name in labels and e.thread == loop]  # fmt: skip
    idle_us, gaps = idle_by_phase(busy, phases, span.start, span.end)
    run_us = span.end - span.start
    busy_us = run_us - sum(idle_us.values())
    print(f"\n{model}, {n} windows, profiled with host phases labelled: {wall:.3f} s ({30 * n / wall:.0f} RTFx), "
          f"device busy {busy_us / run_us:.0%} (any kernel or copy on any stream), {len(steps)} loop steps")
    print("| host phase while the device idles | idle ms | share of the run | gaps |")
    print("|---|---|---|---|")
    for name, us in idle_us.most_common():
        print(f"| {name} | {us / 1e3:.1f} | {us / run_us:.1%} | {gaps[name]} |")
    # device time of the kernels each phase launched (graph replays included); a phase's figure includes its
    # nested phases' (GraphRunner.decode within ModelRunner.decode, for example)
    device_us, calls = collections.Counter(), collections.Counter()
    for e in events:
        if e.name in labels and e.thread == loop:
            device_us[e.name] += e.device_time_total
            calls[e.name] += 1
    print("| phase | device ms (nested phases included) | calls | device us per call |")
    print("|---|---|---|---|")
    for name, us in device_us.most_common():
        if us:
            print(f"| {name} | {us / 1e3:.1f} | {calls[name]} | {us / calls[name]:.0f} |")


if __name__ == "__main__":
    main()
