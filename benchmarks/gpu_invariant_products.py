"""The batch-invariant mode's wide products (the encoder's, engine/kernels/invariant_ops.py) against cuBLAS.

    python benchmarks/gpu_invariant_products.py [--model large-v3] [--windows 1 32]

For each of the encoder's products at the model's widths (q/k/v fused, attention out, MLP in with GELU, MLP out)
and each window count (1,500 rows a window), microseconds per product (triton.testing.do_bench) of
invariant_ops.linear(..., wide=True) against cuBLAS on the same float16 operands (GELU in its epilogue where the
product has one), and their ratio. Random weights; the invariant product's bitwise identity is
tests/gpu/test_batch_invariance.py's job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.kernels import invariant_ops  # noqa: E402
from engine.model.dims import DUMMY_DIMS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="large-v3", choices=sorted(DUMMY_DIMS))
    ap.add_argument("--windows", nargs="+", type=int, default=[1, 32])
    args = ap.parse_args()
    import triton

    d = DUMMY_DIMS[args.model].n_audio_state
    print(f"{args.model} encoder products, float16, {torch.cuda.get_device_name()}, TMA kernel: "
          f"{invariant_ops.tensor_memory_accelerator(torch.empty(1, device='cuda', dtype=torch.float16))}")  # fmt: skip
    print("| windows | product (in -> out) | cuBLAS us | invariant us | invariant / cuBLAS |")
    print("|---|---|---|---|---|")
    for windows in args.windows:
        for name, k, n, gelu in (("q/k/v", d, 3 * d, False), ("attention out", d, d, False),
                                 ("MLP in + GELU", d, 4 * d, True), ("MLP out", 4 * d, d, False)):  # fmt: skip
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(windows * 1500, k, device="cuda", generator=g, dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.float16) * k**-0.5
            b = torch.randn(n, device="cuda", generator=g, dtype=torch.float16)
            cublas = triton.testing.do_bench(
                lambda x=x, w=w, b=b, g=gelu: torch._addmm_activation(b, x, w.t(), use_gelu=g)
            )
            ours = triton.testing.do_bench(
                lambda x=x, w=w, b=b, g=gelu: invariant_ops.linear(x, w, b, gelu=g, wide=True)
            )
            cells = f"{cublas * 1e3:.0f} | {ours * 1e3:.0f} | {ours / cublas:.2f}x"
            print(f"| {windows} | {name} ({k} -> {n}) | {cells} |", flush=True)


if __name__ == "__main__":
    main()
