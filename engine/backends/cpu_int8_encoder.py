"""The encoder's products in int8 on a CPU (dtype int8), CTranslate2's scheme: weights with a scale per output,
activations with a scale per row, products in integers (torch._int_mm: oneDNN's AVX-512 VNNI / AVX-VNNI / AMX
kernels) and rescaled to float32 for the norms, GELU and attention, which stay float32. A 30 s window's products
read a quarter of the bytes and run some 3x faster than float32's at tiny.en's and base's widths on a CPU with VNNI
(`benchmarks/cpu_int8.py`). Where torch's integer product is slower than float32's (a CPU without VNNI or AMX: its
reference path there ran 35x slower than float32's product on an AVX2-only EPYC), the same integer operands are
multiplied as float32 (integer_products_fast, measured once)."""

from __future__ import annotations

import functools
import logging
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels.cpu_kernels import quantize_columns
from engine.model.layer_ops import add_norm
from engine.model.lora import Adapters

log = logging.getLogger(__name__)


@functools.cache
def integer_products_fast() -> bool:
    """Whether torch._int_mm beats float32's product of the same operands on this CPU, timed once on a product of
    an encoder's shape (best of three each)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-127, 128, (256, 384), dtype=torch.int8, generator=gen)
    b = torch.randint(-127, 128, (384, 384), dtype=torch.int8, generator=gen)
    af, bf = a.float(), b.float()

    def best(product) -> float:
        product()  # warm-up: oneDNN picks and builds its kernel on the first call
        times = []
        for _ in range(3):
            start = time.perf_counter()
            product()
            times.append(time.perf_counter() - start)
        return min(times)

    integer, floating = best(lambda: torch._int_mm(a, b)), best(lambda: torch.mm(af, bf))
    fast = integer < floating
    log.info("encoder int8 products: %s (int8 %.2f ms, float32 %.2f ms for 256 x 384 x 384)",
             "torch._int_mm" if fast else "their integer operands in float32", integer * 1e3, floating * 1e3)  # fmt: skip
    return fast


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (rows, n) float32 -> int8 values and a float32 scale per row (rows, 1): x ~ values * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12).div_(127.0)
    return torch.round(x / scale).to(torch.int8), scale


class Int8Linear:
    """One product: int8 rows times the int8 weight, rescaled by the row's and the output's scales, plus bias."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        self.values, scales = quantize_columns(weight.t())  # (in, out) int8, the decode kernels' scheme
        self.scales = scales[None, :]
        self.bias = bias.float().contiguous() if bias is not None else None
        # without a fast integer product, float32's product of the integer values: exact wherever the sums stay
        # within float32's 24 bits, and a last bit off where a sum grows past them
        self.float_values = None if integer_products_fast() else self.values.float()

    @classmethod
    def fuse(cls, linears: list[nn.Linear]) -> Int8Linear:
        """q, k and v as one product (key has no bias: zeros)."""
        weight = torch.cat([lin.weight for lin in linears])
        bias = torch.cat([lin.bias if lin.bias is not None else torch.zeros_like(lin.weight[:, 0]) for lin in linears])
        return cls(weight, bias)

    def __call__(self, rows: Tensor, row_scales: Tensor) -> Tensor:
        if self.float_values is None:
            out = torch._int_mm(rows, self.values).float()
        else:
            out = torch.mm(rows.float(), self.float_values)
        out.mul_(self.scales).mul_(row_scales)
        return out if self.bias is None else out.add_(self.bias)


class Int8Blocks(nn.Module):
    """Every encoder block's four products in int8 (AudioEncoder.use_quantized, start 0: the convolutions before
    the blocks stay float32, a few percent of the encoder's time). The blocks' float32 product weights are freed:
    they keep only their layer norms."""

    start = 0

    def __init__(self, blocks: nn.ModuleList):
        super().__init__()
        self.adapters: Adapters | None = None  # LoRA adapters whose deltas its products add (ModelRunner sets them)
        self.products = []
        # each block's products by name, as adapters name them: q, k, v, out, fc1, fc2
        self.names = [tuple(f"encoder.blocks.{i}.{p}" for p in ("attn.query", "attn.key", "attn.value", "attn.out",
                                                                 "mlp.0", "mlp.2")) for i in range(len(blocks))]  # fmt: skip
        for block in blocks:
            qkv, out, fc1, fc2 = block.take_products()
            self.products.append((
                Int8Linear.fuse(qkv), Int8Linear(out.weight, out.bias), Int8Linear(fc1.weight, fc1.bias),
                Int8Linear(fc2.weight, fc2.bias),
            ))  # fmt: skip

    def forward(self, x: Tensor, h: Tensor, blocks: list[nn.Module], ln_post: nn.LayerNorm) -> Tensor:
        """x: the residual stream entering the first block, h its normalized copy, (batch, time, n_state); returns
        ln_post of the last block's output."""
        b, t, n = x.shape
        heads = blocks[0].attn.n_head
        next_norms = [block.attn_ln for block in blocks[1:]] + [ln_post]
        adapters = self.adapters if self.adapters is not None and self.adapters.active else None

        def adapt(y: Tensor, name: str | tuple[str, ...], inputs: Tensor) -> Tensor:
            """y plus the windows' adapter deltas, computed from the float inputs (windows, time, in)"""
            if adapters is not None:
                adapters.add_to(y.view(b, t, -1), name, inputs.view(b, t, -1))
            return y

        for block, (qkv, out, fc1, fc2), names, next_norm in zip(blocks, self.products, self.names, next_norms):
            rows = h.view(b * t, n)
            y = adapt(qkv(*quantize_rows(rows)), names[:3], rows)
            q, k, v = y.view(b, t, 3, heads, n // heads).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            o = o.transpose(1, 2).reshape(b * t, n)
            x, h = add_norm(x, adapt(out(*quantize_rows(o)), names[3], o).view(b, t, n), block.mlp_ln)
            rows = h.view(b * t, n)
            f = F.gelu(adapt(fc1(*quantize_rows(rows)), names[4], rows))
            x, h = add_norm(x, adapt(fc2(*quantize_rows(f)), names[5], f).view(b, t, n), next_norm)
        return h
