"""Decoder attention on a GPU: each SDPA backend for the one-query cross- and self-attention of a decode step.

    python benchmarks/sdpa_backends.py [--batch 1 256] [--heads 20] [--head-dim 64]

Cross-attention: one query against 1,500 encoder positions, with the time that reading K and V takes at
--bandwidth-tbs. Self-attention: one query against a 64- or 128-position prefix with a per-row mask, as a
boolean mask (which SDPA converts on every call) and as an additive float mask, and (additive mask) the
engine's unfused form, two batched products and a softmax, which it uses from UNFUSED_SELF_ATTENTION_ROWS rows.
CUDA-event timing, float16. Pass e.g. --batch 1 32 64 128 256 to see where the unfused form starts to win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.backends import gpu as engine_model  # noqa: E402

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def time_us(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def per_backend(q, k, v, mask=None) -> str:
    cells = []
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                cells.append(f"{time_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)):.1f}")
        except RuntimeError:  # this backend does not take these inputs
            cells.append("n/a")
    return " | ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 256])
    ap.add_argument("--heads", type=int, default=20)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="HBM bandwidth for the cross-attention floor")
    args = ap.parse_args()
    h, d, dt, dev = args.heads, args.head_dim, torch.float16, "cuda"
    print("| attention | batch | keys | mask | " + " | ".join(f"{b} us" for b in BACKENDS) + " | K/V read floor us / unfused us |")
    print("|---|---|---|---|" + "---|" * len(BACKENDS) + "---|")
    engine_model.UNFUSED_SELF_ATTENTION_ROWS = 1  # the engine's unfused form at every batch size
    for b in args.batch:
        q = torch.randn(b, h, 1, d, device=dev, dtype=dt)
        k, v = (torch.randn(b, h, 1500, d, device=dev, dtype=dt) for _ in range(2))
        floor = b * h * 1500 * d * 2 * 2 / (args.bandwidth_tbs * 1e12) * 1e6
        print(f"| cross | {b} | 1500 | none | {per_backend(q, k, v)} | {floor:.1f} |")
        cache_k, cache_v = (torch.randn(b, h, 448, d, device=dev, dtype=dt) for _ in range(2))
        for keys in (64, 128):
            position = torch.randint(0, keys, (b, 1), device=dev)
            allowed = (torch.arange(keys, device=dev) <= position[:, :, None])[:, None]
            additive = torch.zeros(allowed.shape, device=dev, dtype=dt).masked_fill_(~allowed, float("-inf"))
            k, v = cache_k[:, :, :keys], cache_v[:, :, :keys]
            print(f"| self | {b} | {keys} | bool | {per_backend(q, k, v, allowed)} | - |")
            unfused = time_us(lambda: engine_model.decode_self_attention(q, k, v, additive))
            print(f"| self | {b} | {keys} | additive | {per_backend(q, k, v, additive)} | {unfused:.1f} |")


if __name__ == "__main__":
    main()
