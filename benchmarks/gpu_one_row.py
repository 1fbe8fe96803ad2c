"""A lone sequence's decode-step kernels on a GPU, each against what it replaced.

    python benchmarks/gpu_one_row.py [--only products vocabulary self-attention]

Large-v3 shapes, float16, GPU microseconds per call inside a CUDA graph (Triton's Python launch path would
otherwise be what is timed), each weight one of 8 copies used in turn so it is read from HBM, not L2. Prints:
1. residual add + layer norm + product in one kernel (fused_ops.add_norm_linear) against add_norm and the product
   (add_norm_linear(fused=False)), for 2, 4 and 8 output features per program (NORM_PRODUCT_FEATURES);
2. the vocabulary projection of one row (fused_ops.one_row_logits) against cuBLAS and the float32 cast;
3. the decode step's self-attention kernel at several (keys per block, warps) settings, by rows and the limit its
   rows' positions are spread below (the engine's choice: decode_attention.MANY_PROGRAMS_SETTINGS, and
   FEW_PROGRAMS_SETTINGS below decode_attention.FEW_PROGRAMS programs);
4. the batch-invariant product (invariant_ops.linear, launched as a dependent) for 1, 4 and 16 rows against cuBLAS
   and the default path's one-row kernel: what a lone window pays for load-independent products
   (docs/benchmarks/2026-12-05-invariant-lone-row.md), with the tile kernel and the few-rows kernel
   (invariant_few_rows.py, its weight in shared memory before the wait); then a lone row's chain of 32 layers'
   six products (each weight read once), the invariant ones with the three residual adds + norms a layer apart
   (add_norm at NORM_WARPS) or inside the product (invariant_ops.add_norm_linear), against the default's
   one-row kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from int8_cross_attention import time_us as graph_time_us  # noqa: E402

from engine.kernels import (
    decode_attention,  # noqa: E402
    fused_ops,  # noqa: E402
    invariant_ops,  # noqa: E402
)

COPIES = 8


def time_us(fn) -> float:
    """GPU time per call of fn, from a CUDA graph of 64 calls (int8_cross_attention's timer)."""
    return graph_time_us(fn, calls=64)


def rotating(tensors: list):
    """A function returning the next of `tensors` at each call (a new weight each time, as a decode step's layers)."""
    state = [0]

    def next_one():
        state[0] = (state[0] + 1) % len(tensors)
        return tensors[state[0]]

    return next_one


def fused_products(dev: str) -> None:
    features = (2, 4, 8)
    print("| one row | separate kernels us | " + " | ".join(f"fused, {f} per program" for f in features) + " |")
    print("|---|---|" + "---|" * len(features))
    default = fused_ops.NORM_PRODUCT_FEATURES
    for name, n, out, gelu in (("add + norm + QKV 1280->3840", 1280, 3840, False),
                               ("add + norm + cross query 1280->1280", 1280, 1280, False),
                               ("add + norm + fc1 + GELU 1280->5120", 1280, 5120, True)):  # fmt: skip
        x, y = (torch.randn(1, 1, n, device=dev, dtype=torch.float16) for _ in "xy")
        ln = nn.LayerNorm(n, device=dev, dtype=torch.float16)
        params = rotating([(torch.randn(out, n, device=dev, dtype=torch.float16) * 0.03,
                            torch.randn(out, device=dev, dtype=torch.float16)) for _ in range(COPIES)])  # fmt: skip
        cells = [time_us(lambda: fused_ops.add_norm_linear(x, y, ln, *params(), gelu, fused=False))]
        for f in features:  # the kernel's tiling, a compile-time tuning constant swept here
            fused_ops.NORM_PRODUCT_FEATURES = f
            cells.append(time_us(lambda: fused_ops.add_norm_linear(x, y, ln, *params(), gelu)))
        fused_ops.NORM_PRODUCT_FEATURES = default
        print(f"| {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)


def vocabulary(dev: str) -> None:
    vocab, n = 51866, 1280
    x = torch.randn(1, n, device=dev, dtype=torch.float16)
    weights = rotating([torch.randn(vocab, n, device=dev, dtype=torch.float16) * 0.03 for _ in range(2)])
    cublas = time_us(lambda: F.linear(x, weights()).float())
    kernel = time_us(lambda: fused_ops.one_row_logits(x, weights()))
    print(f"\nvocabulary projection {vocab} x {n}, one row: cuBLAS + cast {cublas:.1f} us, one_row_logits {kernel:.1f} us")


def self_attention(dev: str) -> None:
    """The step's self-attention kernel at each (keys per block, warps), rows with positions spread below a limit."""
    heads, dim = 20, 64
    k_cache = torch.randn(300, heads, 448, dim, device=dev, dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    settings = [(16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8)]
    default = (decode_attention.MANY_PROGRAMS_SETTINGS, decode_attention.FEW_PROGRAMS_SETTINGS)
    print("\n| rows | positions below | " + " | ".join(f"{b} keys, {w} warps us" for b, w in settings) + " |")
    print("|---|---|" + "---|" * len(settings))
    gen = torch.Generator(device=dev).manual_seed(0)
    for rows in (1, 8, 64, 256):
        qkv = torch.randn(rows, 1, 3 * heads * dim, device=dev, dtype=torch.float16)
        for limit in (60, 104, 441):
            pos = torch.randint(4, limit, (rows, 1), device=dev, generator=gen)
            cells = []
            for setting in settings:
                decode_attention.MANY_PROGRAMS_SETTINGS = decode_attention.FEW_PROGRAMS_SETTINGS = setting
                cells.append(time_us(lambda: decode_attention.self_attention_step(qkv, k_cache, v_cache, pos, 0)))
            decode_attention.MANY_PROGRAMS_SETTINGS, decode_attention.FEW_PROGRAMS_SETTINGS = default
            best = min(cells)
            text = [f"**{us:.1f}**" if us == best else f"{us:.1f}" for us in cells]
            print(f"| {rows} | {limit} | " + " | ".join(text) + " |", flush=True)


def invariant_products(dev: str) -> None:
    print("\n| product | rows | cuBLAS us | one-row kernel us | invariant tile us | invariant few-rows us |")
    print("|---|---|---|---|---|---|")
    for name, k, n, gelu in (("QKV", 1280, 3840, False), ("out", 1280, 1280, False), ("fc1 + GELU", 1280, 5120, True),
                             ("fc2", 5120, 1280, False)):  # fmt: skip
        proj = rotating([nn.Linear(k, n, device=dev, dtype=torch.float16) for _ in range(COPIES)])
        for rows in (1, 4, 16):
            x = torch.randn(rows, 1, k, device=dev, dtype=torch.float16)

            def invariant(few: bool):
                p = proj()
                return invariant_ops.linear(x, p.weight, p.bias, gelu=gelu, pdl=True, few_rows=few)

            cells = [time_us(lambda: proj()(x))]
            cells.append(time_us(lambda: fused_ops.linear(proj(), x)) if rows == 1 else float("nan"))
            cells += [time_us(lambda: invariant(False)), time_us(lambda: invariant(True))]
            print(f"| {name} {k}->{n} | {rows} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    layer_chain(dev)


def layer_chain(dev: str, layers: int = 32) -> None:
    """A lone row's 32 layers of six products, each weight read once, the norms a layer's three (inputs fixed:
    the kernels' times, not the values, are the point)."""
    half = torch.float16
    shapes = ((1280, 3840, False), (1280, 1280, False), (1280, 1280, False), (1280, 1280, False), (1280, 5120, True),
              (5120, 1280, False))  # fmt: skip
    products = [(nn.Linear(k, n, device=dev, dtype=half), g) for _ in range(layers) for k, n, g in shapes]
    norms = [nn.LayerNorm(1280, device=dev, dtype=half) for _ in range(layers)]
    xs = {k: torch.randn(1, 1, k, device=dev, dtype=half) for k in (1280, 5120)}
    stream = torch.randn(1, 1, 1280, device=dev, dtype=half)

    def chain(few: bool, fused_norms: bool):
        def run():
            for j, (p, g) in enumerate(products):
                normed = j % 6 in (0, 2, 4)  # QKV, the cross-attention's query, fc1 follow a norm
                if normed and fused_norms:
                    invariant_ops.add_norm_linear(stream, xs[1280], norms[j // 6], p.weight, p.bias, gelu=g, pdl=True)
                    continue
                if normed:
                    fused_ops.add_norm(stream, xs[1280], norms[j // 6], pdl=True, warps=invariant_ops.NORM_WARPS)
                invariant_ops.linear(xs[p.weight.shape[1]], p.weight, p.bias, gelu=g, pdl=True, few_rows=few)

        return run

    def default():
        for j, (p, g) in enumerate(products):
            if j % 6 in (0, 2, 4):
                fused_ops.add_norm_linear(stream, xs[1280], norms[j // 6], p.weight, p.bias, gelu=g)
            else:
                fused_ops.linear(p, xs[p.weight.shape[1]])

    print(f"\n| a lone row's {layers} layers (6 products, 3 norms each) | us | us a layer |")
    print("|---|---|---|")
    variants = (
        ("default: one-row kernels, norms inside the products", default),
        ("invariant tile kernel, norms apart", chain(False, False)),
        ("invariant few-rows kernel, norms apart", chain(True, False)),
        ("invariant few-rows kernel, norms inside the products", chain(True, True)),
    )  # fmt: skip
    for name, fn in variants:
        us = graph_time_us(fn, calls=1)
        print(f"| {name} | {us:.1f} | {us / layers:.2f} |", flush=True)


def main() -> None:
    import argparse

    sections = {
        "products": fused_products, "vocabulary": vocabulary, "self-attention": self_attention,
        "invariant": invariant_products,
    }  # fmt: skip
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", choices=sorted(sections), default=list(sections))
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, float16, large-v3 shapes")
    for name in args.only:
        sections[name]("cuda")


if __name__ == "__main__":
    main()
