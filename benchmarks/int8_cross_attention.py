"""Cross-attention of a decode step on a GPU: the int8 cache's Triton kernel against cuDNN SDPA on float16.

    python benchmarks/int8_cross_attention.py [--batch 1 8 64 256] [--heads 20] [--sweep]

One query per row against 1,500 encoder positions, K and V read in place from a cache slice (as in the engine).
Prints GPU microseconds per call (20 calls captured in a CUDA graph, as the engine runs them: Triton's Python
launch path would otherwise be what is timed at small batches), the bytes each reads and the bandwidth that
makes, and the int8 kernel's speed-up; then the quantization of one layer's keys for 32 windows, the separate
torch ops against the one kernel the engine uses. --sweep also times the kernel's block size and warp count
choices (int8_attention.BLOCK_N, NUM_WARPS, NUM_STAGES) so the defaults can be checked on a new card.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine import int8_attention  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8, 64, 256])
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    h, d, n, dev = args.heads, 64, 1500, "cuda"
    print(f"{torch.cuda.get_device_name()}, {h} heads x {d}, {n} keys; us per call, TB/s of K/V bytes read")
    print("| batch | fp16 cuDNN us | TB/s | int8 us | TB/s | speed-up | splits |")
    print("|---|---|---|---|---|---|---|")
    for b in args.batch:
        slots = b + 1  # a slice of a larger cache, as in the engine
        k16, v16 = (torch.randn(slots, h, n, d, device=dev, dtype=torch.float16) for _ in "kv")
        (kq, ks), (vq, vs) = int8_attention.quantize(k16), int8_attention.quantize(v16)
        q = torch.randn(b, h, 1, d, device=dev, dtype=torch.float16)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            fp16 = time_us(lambda: F.scaled_dot_product_attention(q, k16[:b], v16[:b]))
        int8 = time_us(lambda: int8_attention.int8_attention(q, kq[:b], ks[:b], vq[:b], vs[:b]))
        bytes16 = 2 * b * h * n * d * 2
        bytes8 = 2 * b * h * n * (d + 2)
        splits = int8_attention._splits(b * h, n)
        print(f"| {b} | {fp16:.1f} | {bytes16 / fp16 / 1e6:.2f} | {int8:.1f} | {bytes8 / int8 / 1e6:.2f} | "
              f"{fp16 / int8:.2f}x | {splits} |")  # fmt: skip
        if args.sweep:
            default = (int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES)
            cells = []
            for block in (16, 32, 64, 128):
                for warps in (2, 4, 8):
                    for stages in (1, 2, 3, 4):
                        int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES = block, warps, stages
                        t = time_us(lambda: int8_attention.int8_attention(q, kq[:b], ks[:b], vq[:b], vs[:b]))
                        cells.append((t, f"{block}/{warps}/{stages}: {t:.1f}"))
            int8_attention.BLOCK_N, int8_attention.NUM_WARPS, int8_attention.NUM_STAGES = default
            cells.sort()
            print(f"|   sweep {b} (block/warps/stages: us, fastest first) | " + ", ".join(c for _, c in cells[:12]) + " |")
    x = torch.randn(32, n, h * d, device=dev, dtype=torch.float16).view(32, n, h, d).transpose(1, 2)
    values = torch.zeros(32, h, n, d, dtype=torch.int8, device=dev)
    scale = torch.zeros(32, h, n, dtype=int8_attention.SCALE_DTYPE, device=dev)

    def separate_ops():
        values[...], scale[...] = int8_attention.quantize(x)

    ops, kernel = time_us(separate_ops, 3), time_us(lambda: int8_attention.quantize_into(x, values, scale), 3)
    print(f"quantize one layer's keys of 32 windows: torch ops {ops:.0f} us, kernel {kernel:.0f} us")


if __name__ == "__main__":
    main()
