"""What the GPU runs for one encoder batch and one decoder step, and whether encoder and decoder overlap.

    python benchmarks/gpu_kernels.py --model large-v3 --tokenizer <multilingual tokenizer.json>

Dummy weights, float16. Prints:
1. the top CUDA kernels (torch.profiler, eager, so each kernel keeps its name) of an encoder batch and of one
   decoder step at batch 1 and 256 with 128 cached positions: time, count, and the total per call;
2. captured graphs: host time per replay call, wall time per step when each step is awaited, GPU time by events;
3. an encoder batch replayed on a second stream (its own graph pool) while the decoder replays steps on the
   main stream, against the two run one after the other: does running them concurrently gain anything?
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.runtime.cuda_graphs import GraphRunner  # noqa: E402
from engine.runtime.model_runner import ModelRunner  # noqa: E402

KV = 128  # cached positions attended in the decoder steps measured here


def top_kernels(fn, label: str, rows: int, calls: int = 3) -> None:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            by_name[event.name][0] += event.device_time
            by_name[event.name][1] += 1
    total = sum(t for t, _ in by_name.values()) / calls
    count = sum(c for _, c in by_name.values()) // calls
    print(f"\n{label}: {total / 1e3:.2f} ms of kernels per call, {count} kernels")
    print("| ms per call | kernels | kernel |")
    print("|---|---|---|")
    for name, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"| {t / calls / 1e3:.3f} | {c // calls} | {name[:90]} |")


def gpu_ms(fn, n: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def host_and_wall_ms(fn, n: int = 50) -> tuple[float, float]:
    fn()
    torch.cuda.synchronize()
    host, begin = 0.0, time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        fn()
        host += time.perf_counter() - t
        torch.cuda.synchronize()
    return host / n * 1e3, (time.perf_counter() - begin) / n * 1e3


def median_ms(fn, n: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[n // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="large-v3")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for dummy multilingual models")
    ap.add_argument("--encoder-batch", type=int, default=8)
    ap.add_argument("--rows", type=int, default=12, help="kernels listed per table")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    runner = ModelRunner(EngineConfig(model=args.model, dummy_weights=True, device="cuda", dtype="float16",
                                      tokenizer=args.tokenizer, enforce_eager=True, max_num_seqs=256))
    model, dims, dev = runner.model, runner.dims, runner.device
    batches = (1, 8, 256)

    # 1. kernels, eager
    mel = torch.randn(args.encoder_batch, dims.n_mels, 3000, device=dev, dtype=torch.float16)
    top_kernels(lambda: model.encoder(mel), f"{args.model} encoder, batch {args.encoder_batch}", args.rows)
    backend = runner.backend
    for bs in (1, 256):
        tokens = torch.zeros(bs, 1, dtype=torch.long, device=dev)
        positions = torch.full((bs, 1), KV - 28, dtype=torch.long, device=dev)
        top_kernels(lambda: backend.logits(backend.decode_step(tokens, positions, runner.cache, KV)[:, -1]),
                    f"{args.model} decoder step, batch {bs}, {KV} positions", args.rows)

    # 2. captured graphs
    graphs = GraphRunner(backend, runner.cache, runner.num_slots, 32, runner.dtype)
    graphs.decode_sizes, graphs.kv_sizes, graphs.encoder_sizes = list(batches), [KV], [args.encoder_batch, 32]
    graphs.capture()
    graphs.dec.positions.fill_(KV - 28)
    print("\n| captured graph | host ms per replay call | wall ms per awaited replay | GPU ms (events) |")
    print("|---|---|---|---|")
    for bs in batches:
        g = graphs.decoder_graphs[(bs, KV)]
        host, wall = host_and_wall_ms(g.replay)
        print(f"| decoder step, batch {bs} | {host:.3f} | {wall:.3f} | {gpu_ms(g.replay):.3f} |")
    for bs in (args.encoder_batch, 32):
        g = graphs.encoder_graphs[bs]
        host, wall = host_and_wall_ms(g.replay, 10)
        print(f"| encoder, batch {bs} | {host:.3f} | {wall:.3f} | {gpu_ms(g.replay, 5):.3f} |")

    # 3. an encoder batch of 32 on its own stream and pool, concurrent with decoder steps
    side = torch.cuda.Stream(dev)
    mel32 = torch.randn(32, dims.n_mels, 3000, device=dev, dtype=torch.float16)
    features = torch.empty(32, dims.n_audio_ctx, dims.n_audio_state, device=dev, dtype=torch.float16)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        features.copy_(model.encoder(mel32))  # warm-up outside the capture
    torch.cuda.synchronize()
    encoder_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(encoder_graph, pool=torch.cuda.graph_pool_handle(), stream=side):
        features.copy_(model.encoder(mel32))
    print("\n| decoder steps on the main stream | encoder batch 32 on a second stream | decoder alone ms | encoder alone ms "
          "| one after the other ms | concurrent ms |")
    print("|---|---|---|---|---|---|")
    for bs, steps in ((256, 8), (8, 30), (1, 30)):
        g = graphs.decoder_graphs[(bs, KV)]

        def decoder() -> None:
            for _ in range(steps):
                g.replay()

        def encoder() -> None:
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                encoder_graph.replay()
            torch.cuda.current_stream(dev).wait_stream(side)

        def both() -> None:
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                encoder_graph.replay()
            decoder()
            torch.cuda.current_stream(dev).wait_stream(side)

        d, e, c = median_ms(decoder), median_ms(encoder), median_ms(both)
        print(f"| {steps} x batch {bs} | 1 replay | {d:.1f} | {e:.1f} | {d + e:.1f} | {c:.1f} |")


if __name__ == "__main__":
    main()
