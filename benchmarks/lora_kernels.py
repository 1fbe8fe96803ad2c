"""The LoRA kernels of a decode step alone (engine/kernels/lora.py): one decoder layer's products (q/k/v fused, the
self-attention's out, the cross-attention's query and out, fc1, fc2) in a CUDA graph, without and with each row's
adapter delta, by rows, adapters in the batch, rank and kernel setting (parts of A x, outputs per program of the
second kernel). A GPU only.

    python benchmarks/lora_kernels.py [--model large-v3] [--rows 1 8 64 256] [--adapters 1 16] [--ranks 16 64] \
        [--splits 8 4] [--columns 64 256]

Random float16 weights and adapters (every adapter at the rank given, 16 resident), the rows round-robin over the
adapters. Prints, per configuration, the layer's products alone (us per replay of the graph, median of --repeats
timings of 100 replays) and each setting's added time; the step's added time is that times the decoder's layers.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels import lora
from engine.model.dims import DUMMY_DIMS

CAPACITY = 16


def layer_products(n: int) -> list[tuple[int, int, int]]:
    """(slices, in, out) of a decoder layer's per-step products."""
    return [(3, n, n), (1, n, n), (1, n, n), (1, n, n), (1, n, 4 * n), (1, 4 * n, n)]


def run_products(xs: list, weights: list, ys: list) -> None:
    for x, w, y in zip(xs, weights, ys, strict=True):
        torch.matmul(x, w.t(), out=y)


def run_adapted(xs: list, weights: list, ys: list, stacks: list, kernel_args: tuple, **setting) -> None:
    run_products(xs, weights, ys)
    table, rows, n_segments, ranks, partial = kernel_args
    for x, y, (a, b) in zip(xs, ys, stacks, strict=True):
        lora.add_lora(y, x, table, rows, n_segments, a, b, ranks, CAPACITY, partial, **setting)


def run_overlapped(xs: list, weights: list, ys: list, stacks: list, kernel_args: tuple, side, pdl: bool) -> None:
    """Each product's A x on a second stream while the product itself runs (both read only x), then B's part."""
    table, rows, n_segments, ranks, partial = kernel_args
    main = torch.cuda.current_stream()
    for x, w, y, (a, b) in zip(xs, weights, ys, stacks, strict=True):
        side.wait_stream(main)
        with torch.cuda.stream(side):
            splits = lora.shrink(x, table, rows, n_segments, a, ranks, CAPACITY, partial, pdl=pdl)
        torch.matmul(x, w.t(), out=y)
        main.wait_stream(side)
        lora.expand(y, table, rows, n_segments, b, ranks, CAPACITY, partial, splits, pdl=pdl)


def graph_us(fn, repeats: int) -> float:
    """Median us per replay of a CUDA graph of fn()."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(20):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 10)  # ms per 100 replays -> us per replay
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="large-v3")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--adapters", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--splits", type=int, nargs="+", default=[lora.MAX_SPLITS])
    ap.add_argument("--columns", type=int, nargs="+", default=[lora.EXPAND_COLUMNS])
    ap.add_argument("--pdl", type=int, nargs="+", default=[0, 1], help="0: plain launches, 1: dependent launches")
    ap.add_argument("--overlap", action="store_true", help="also A x on a second stream beside each product (PDL)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dims = DUMMY_DIMS[args.model]
    device, dtype = torch.device("cuda"), torch.float16
    g = torch.Generator(device=device).manual_seed(0)
    shapes = layer_products(dims.n_text_state)
    weights = [torch.randn(s * o, i, device=device, dtype=dtype, generator=g) * i**-0.5 for s, i, o in shapes]
    settings = [(s, c, p) for s in args.splits for c in args.columns for p in args.pdl]
    print(f"{args.model} decoder layer ({dims.n_text_layer} a step), {torch.cuda.get_device_name()}; us per layer: "
          f"the products alone, then added by the LoRA kernels (parts of A x, outputs per program, launch)")  # fmt: skip
    header = "| rank | rows | adapters | products us | " + " | ".join(
        f"+us {s} parts, {c} outputs{', PDL' if p else ''}" for s, c, p in settings
    )
    if args.overlap:
        header += " | +us A x beside the product, PDL"
    print(header + " | step +ms (best) |")
    print("|---|---|---|---|" + "---|" * (len(settings) + 1 + args.overlap))
    side = torch.cuda.Stream() if args.overlap else None
    for rank in args.ranks:
        stacks = []
        for s, i, o in shapes:
            a = torch.randn(CAPACITY + 1, s, rank, i, device=device, dtype=dtype, generator=g) * i**-0.5
            b = torch.randn(CAPACITY + 1, s, o, rank, device=device, dtype=dtype, generator=g) * 1e-2
            a[0], b[0] = 0, 0
            stacks.append((a, b))
        ranks = torch.full((CAPACITY + 1,), rank, dtype=torch.int32, device=device)
        for rows in args.rows:
            xs = [torch.randn(rows, 1, i, device=device, dtype=dtype, generator=g) for _, i, _ in shapes]
            ys = [torch.empty(rows, 1, s * o, device=device, dtype=dtype) for s, _, o in shapes]
            n_segments = lora.max_segments(rows, CAPACITY)
            partial = torch.empty(lora.partial_elements(n_segments, 3, rank), dtype=torch.float32, device=device)
            base = graph_us(functools.partial(run_products, xs, weights, ys), args.repeats)
            for count in args.adapters:
                if count > rows:
                    continue
                row_adapters = np.array([1 + i % count for i in range(rows)], dtype=np.int32)
                table = torch.from_numpy(lora.segments(row_adapters, rows, n_segments)).to(device)
                kernel_args = (table, rows, n_segments, ranks, partial)
                added = [
                    graph_us(functools.partial(run_adapted, xs, weights, ys, stacks, kernel_args, max_splits=splits,
                                               columns=columns, pdl=bool(pdl)), args.repeats) - base
                    for splits, columns, pdl in settings
                ]  # fmt: skip
                if args.overlap:
                    overlapped = functools.partial(run_overlapped, xs, weights, ys, stacks, kernel_args, side, True)
                    added.append(graph_us(overlapped, args.repeats) - base)
                cells = " | ".join(f"{us:.1f}" for us in added)
                step_ms = min(added) * dims.n_text_layer / 1000
                print(f"| {rank} | {rows} | {count} | {base:.1f} | {cells} | {step_ms:.2f} |", flush=True)
    # the same check as tests/gpu/test_lora_cuda.py, on these shapes: the kernel against the products in float32
    x, (a, b), (s, i, o) = xs[0], stacks[0], shapes[0]
    ref = torch.zeros(rows, 1, s * o, device=device, dtype=torch.float32)
    for r, adapter in enumerate(row_adapters):
        for j in range(s):
            ref[r, 0, j * o : (j + 1) * o] = F.linear(F.linear(x[r, 0].float(), a[adapter, j].float()),
                                                      b[adapter, j].float())  # fmt: skip
    y = torch.zeros(rows, 1, s * o, device=device, dtype=dtype)
    lora.add_lora(y, x, table, rows, n_segments, a, b, ranks, CAPACITY, partial)
    print(f"largest difference from float32 products: {(y.float() - ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
