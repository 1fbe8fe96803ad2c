"""Cross-attention of a decode step on a GPU: the int8 cache's CUDA and Triton kernels against cuDNN SDPA on float16.

    python benchmarks/int8_cross_attention.py [--batch 1 8 64 256] [--heads 20] [--sweep] [--sweep-cuda] [--beams 5]

One query per row against 1,500 encoder positions, K and V read in place from a cache slice (as in the engine).
Prints GPU microseconds per call (20 calls captured in a CUDA graph, as the engine runs them: the Python launch
paths would otherwise be what is timed at small batches), the bytes each reads and the bandwidth that makes, and
the speed-ups; then the quantization of one layer's keys for 32 windows, the separate torch ops against the one
kernel the engine uses. --sweep also times the Triton kernel's block size and warp count choices
(int8_attention.BLOCK_N, NUM_WARPS, NUM_STAGES), --sweep-cuda the CUDA kernel's compile-time settings
(int8_attention.CUDA_SETTINGS) and its key splits, so the defaults can be checked on a new card. --beams B also
times rows that read their cache slots through an index, B rows per slot as a beam search's (beam_rows).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.kernels import int8_attention  # noqa: E402
from engine.kernels.options import KernelOptions  # noqa: E402


def time_us(fn, calls: int = 20, replays: int = 5) -> float:
    """GPU time per call of fn, from a CUDA graph of `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up (compilation, workspaces) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * replays) * 1e3


def time_with(kernel: str, int8_args) -> float:
    if kernel == "cuda":
        assert int8_attention._cuda_kernel(int8_args[0]) is not None, "the CUDA kernel did not build"
    kernels = KernelOptions(int8_attention=kernel)
    return time_us(lambda: int8_attention.int8_attention(*int8_args, kernels))


def sweep_cuda(int8_args) -> list[str]:
    """The CUDA kernel under other compile-time settings and key splits; cells 'setting=value ...: us'."""
    default, default_target = dict(int8_attention.CUDA_SETTINGS), int8_attention.CUDA_TARGET_BLOCKS
    grid = itertools.product((32, 64, 128, 256), (1, 2, 3, 4), (1, 8), (0, 1, 2))
    variants = [{"THREADS": t, "UNROLL": u, "MIN_BLOCKS": mb, "LOAD_HINT": hint} for t, u, mb, hint in grid]
    variants += [{"K_DP4A": 0}, {"V_PRMT": 0}, {"K_DP4A": 0, "V_PRMT": 0}, {"TPK": 8}]
    cells = []
    try:
        for change in variants:
            int8_attention.CUDA_SETTINGS = {**default, **change}
            int8_attention._cuda_kernels.clear()
            t = time_with("cuda", int8_args)
            cells.append((t, " ".join(f"{k}={v}" for k, v in change.items()) + f": {t:.1f}"))
        int8_attention.CUDA_SETTINGS = default
        int8_attention._cuda_kernels.clear()
        for target in (160, 320, 1280, 2560, 5120):
            int8_attention.CUDA_TARGET_BLOCKS = target
            t = time_with("cuda", int8_args)
            splits = int8_attention._cuda_splits(int8_args[0].shape[:3].numel())
            cells.append((t, f"target blocks {target} (splits {splits}): {t:.1f}"))
    finally:
        int8_attention.CUDA_SETTINGS, int8_attention.CUDA_TARGET_BLOCKS = default, default_target
        int8_attention._cuda_kernels.clear()
    return [c for _, c in sorted(cells)]


def beam_rows(batches: list[int], beams: int, h: int, d: int, n: int, dev: str) -> None:
    """Rows reading cache slots through an index, `beams` rows per slot (a beam search's), their slots scattered
    over the cache as a running batch's are: the kernels' time walking the rows in order, and in the order that
    puts one slot's rows side by side (the engine's), against as many rows each with a slot of its own."""
    print(f"\n{beams} rows per slot (beam search), int8 CUDA kernel, through the slot index; us per call")
    print("| rows | own slot each | shared, rows in order | shared, one slot's rows side by side | side by side vs own |")
    print("|---|---|---|---|---|")
    kernels = KernelOptions(int8_attention="cuda")
    for b in batches:
        windows = max(1, b // beams)
        slots = b + 1
        k16, v16 = (torch.randn(slots, h, n, d, device=dev, dtype=torch.float16) for _ in "kv")
        (kq, ks), (vq, vs) = int8_attention.quantize(k16), int8_attention.quantize(v16)
        del k16, v16
        q = torch.randn(b, h, 1, d, device=dev, dtype=torch.float16)
        gen = torch.Generator().manual_seed(0)
        window_slot = torch.randperm(slots, generator=gen)[:windows]
        rows = torch.randperm(b, generator=gen)  # the group's rows scattered, as after compactions
        shared = window_slot[torch.arange(b) % windows][rows].to(torch.int32)
        own = torch.randperm(slots, generator=gen)[:b].to(torch.int32)
        order = torch.sort(shared.long(), stable=True).indices.to(torch.int32)
        shared, own, order = shared.to(dev), own.to(dev), order.to(dev)

        def call(index, walk):
            return lambda: int8_attention.indexed_attention(q, kq, ks, vq, vs, index, walk, kernels)

        t_own, t_plain, t_sorted = (time_us(f) for f in (call(own, None), call(shared, None), call(shared, order)))
        print(f"| {b} | {t_own:.1f} | {t_plain:.1f} | {t_sorted:.1f} | {t_own / t_sorted:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64, 256])
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-cuda", action="store_true")
    ap.add_argument("--beams", type=int, default=0, help="also time rows that share slots, this many per slot")
    args = ap.parse_args()
    h, d, n, dev = args.heads, 64, 1500, "cuda"
    print(f"{torch.cuda.get_device_name()}, {h} heads x {d}, {n} keys; us per call, TB/s of K/V bytes read")
    print("| batch | fp16 cuDNN us | TB/s | int8 Triton us | TB/s | int8 CUDA us | TB/s | CUDA vs Triton "
          "| CUDA vs cuDNN | splits (Triton / CUDA) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in args.batch:
        slots = b + 1  # a slice of a larger cache, as in the engine
        k16, v16 = (torch.randn(slots, h, n, d, device=dev, dtype=torch.float16) for _ in "kv")
        (kq, ks), (vq, vs) = int8_attention.quantize(k16), int8_attention.quantize(v16)
        q = torch.randn(b, h, 1, d, device=dev, dtype=torch.float16)
        int8_args = (q, kq[:b], ks[:b], vq[:b], vs[:b])
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            fp16 = time_us(lambda: F.scaled_dot_product_attention(q, k16[:b], v16[:b]))
        triton, cuda = (time_with(kernel, int8_args) for kernel in ("triton", "cuda"))
        bytes16 = 2 * b * h * n * d * 2
        bytes8 = 2 * b * h * n * (d + 2)
        splits = f"{int8_attention._triton_splits(b * h, n)} / {int8_attention._cuda_splits(b * h)}"
        print(f"| {b} | {fp16:.1f} | {bytes16 / fp16 / 1e6:.2f} | {triton:.1f} | {bytes8 / triton / 1e6:.2f} | "
              f"{cuda:.1f} | {bytes8 / cuda / 1e6:.2f} | {triton / cuda:.2f}x | {fp16 / cuda:.2f}x "
              f"| {splits} |")  # fmt: skip
        if args.sweep:
            default = (int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES)
            cells = []
            for block in (16, 32, 64, 128):
                for warps in (2, 4, 8):
                    for stages in (1, 2, 3, 4):
                        int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES = block, warps, stages
                        t = time_with("triton", int8_args)
                        cells.append((t, f"{block}/{warps}/{stages}: {t:.1f}"))
            int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES = default
            cells.sort()
            print(f"|   sweep {b} (block/warps/stages: us, fastest first) | " + ", ".join(c for _, c in cells[:12]) + " |")
        if args.sweep_cuda:
            print(f"|   CUDA sweep {b} (us, fastest first) | " + ", ".join(sweep_cuda(int8_args)[:12]) + " |")
    if args.beams:
        beam_rows(args.batch, args.beams, h, d, n, dev)
    x = torch.randn(32, n, h * d, device=dev, dtype=torch.float16).view(32, n, h, d).transpose(1, 2)
    values = torch.zeros(32, h, n, d, dtype=torch.int8, device=dev)
    scale = torch.zeros(32, h, n, dtype=int8_attention.SCALE_DTYPE, device=dev)

    def separate_ops():
        values[...], scale[...] = int8_attention.quantize(x)

    ops, kernel = time_us(separate_ops, 3), time_us(lambda: int8_attention.quantize_into(x, values, scale), 3)
    print(f"quantize one layer's keys of 32 windows: torch ops {ops:.0f} us, kernel {kernel:.0f} us")


if __name__ == "__main__":
    main()
