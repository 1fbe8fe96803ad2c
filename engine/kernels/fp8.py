"""Float8 products for the encoder (opt-in: `EngineConfig.encoder_precision = "float8"`).

At high concurrency the encoder is ~40% of a GPU's time (large-v3, 256 windows on an H200:
`benchmarks/gpu_profile.py`) and ~80% of it is four products per layer over 1,500 rows per window, which cuBLAS
runs at ~680 TFLOP/s in float16. The same products in float8 e4m3 (`torch._scaled_mm`, Hopper's and Ada's FP8
tensor cores) take 0.5-0.6x the time (H200, 48,000 rows, both of the MLP's shapes; `benchmarks/gpu_encoder.py`
times the whole encoder in float16 and in float8).

Scaling: each weight's output feature (row) and each activation row (a time step of one window) gets its own
scale, amax / 448 (e4m3's largest value), so one loud frame does not flatten the others. The activation side is
quantized where it is produced (engine/kernels/fused_ops.py): by the residual add + layer norm before the attention
and the MLP, by the GELU after the MLP's first product, and while reading the attention output in place; the
products write float16 with the bias added. Attention itself, the convolutions, the norms, the decoder and the
first blocks (below) stay in the model's precision.

The cost is precision: a product's relative error is ~3.7% on Gaussian data (against ~0.1% in float16); what that
does to transcripts is measured on real weights (tests/gpu/test_fp8_encoder.py, BENCHMARKS.md). It stays opt-in.

The first MODEL_DTYPE_BLOCKS blocks keep the model's dtype. Whisper's encoder has attention-sink frames: a few MLP
units act as a switch, far off on most frames and strongly on for some (padding, fixed positions), and later blocks
attend to those frames. The error of float8 early on flips that switch on a few frames per window, which then come
out unrelated to their float16 selves (cosine ~-0.2). With every block in float8, a CPU emulation of these products
on the test clips gave 39 such frames (cosine < 0.9) of 39,000 for tiny.en and 874 for base, whose sinks form in
four of six blocks; with the first two blocks in float32, 4 and 7, and base's first-percentile frame cosine is
0.996 where it is 0.61 with every block in float8; on the GPU, tiny.en's output on a real clip is 4.2% from float16
instead of 8.9% (tests/gpu/test_fp8_encoder.py; `benchmarks/gpu_encoder.py --model-dtype-blocks N` prints the
error on random input). Word error rates did not move measurably either way; the encoder output did. On large-v3
two blocks are 1/16 of the products.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.kernels import fused_ops
from engine.kernels.fused_ops import add_norm, add_norm_fp8, quantize_rows

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MODEL_DTYPE_BLOCKS = 2  # the encoder's first blocks, kept in the model's dtype (see above)


def unsupported_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why float8 encoder products cannot run here (None when they can)."""
    if device.type != "cuda":
        return "float8 encoder products need a CUDA GPU"
    if dtype not in (torch.float16, torch.bfloat16):
        return "float8 encoder products need a float16 or bfloat16 model"
    if fused_ops.triton is None:
        return "float8 encoder products need Triton"
    if not hasattr(torch, "_scaled_mm") or torch.cuda.get_device_capability(device) < (8, 9):
        return "float8 encoder products need FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper)"
    return None


class Fp8Linear(nn.Module):
    """A linear layer's weight in e4m3 with a float32 scale per output feature; inputs come quantized by row."""

    def __init__(self, weight: Tensor, bias: Tensor):
        super().__init__()
        scale = weight.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        self.register_buffer("weight", (weight.float() / scale).to(FP8))  # (out, in), row-major
        self.register_buffer("scale", scale.t().contiguous())  # (1, out)
        self.register_buffer("bias", bias)

    @classmethod
    def fuse(cls, layers: list[nn.Linear]) -> Fp8Linear:
        """One product for several layers on the same input (q, k, v), outputs side by side; a missing bias
        (Whisper's key) is zeros."""
        weight = torch.cat([layer.weight for layer in layers])
        biases = [layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features) for layer in layers]
        return cls(weight, torch.cat(biases))

    def forward(self, x: Tensor, x_scale: Tensor) -> Tensor:
        """x (rows, in) float8 with x_scale (rows, 1) float32 -> (rows, out) in the bias's dtype."""
        return torch._scaled_mm(
            x, self.weight.t(), scale_a=x_scale, scale_b=self.scale, bias=self.bias,
            out_dtype=self.bias.dtype, use_fast_accum=True,
        )  # fmt: skip


class Fp8Blocks(nn.Module):
    """The products of an encoder's blocks from `start` on in float8; every product's input is quantized by the
    kernel that makes it (the add + norms, the GELU, the attention output's read), so float8 adds no pass over the
    rows. Their float16 weights are freed: the blocks keep only their layer norms."""

    def __init__(self, blocks: nn.ModuleList, start: int):
        super().__init__()
        self.start = min(start, len(blocks))
        products = []
        for block in list(blocks)[self.start :]:
            qkv, out, fc1, fc2 = block.take_products()
            products.append(nn.ModuleDict({
                "qkv": Fp8Linear.fuse(qkv),
                "out": Fp8Linear(out.weight, out.bias),
                "fc1": Fp8Linear(fc1.weight, fc1.bias),
                "fc2": Fp8Linear(fc2.weight, fc2.bias),
            }))  # fmt: skip
        self.products = nn.ModuleList(products)

    def __len__(self) -> int:
        return len(self.products)

    def __getitem__(self, i: int) -> nn.ModuleDict:
        return self.products[i]

    def forward(self, x: Tensor, h: Tensor, blocks: list[nn.Module], ln_post: nn.LayerNorm) -> Tensor:
        """x: the residual stream entering block `start`, h its normalized copy, (batch, time, n_state); returns
        ln_post of the last block's output."""
        b, t, n = x.shape
        heads = blocks[0].attn.n_head
        h, h_scale = quantize_rows(h.view(b * t, n))
        for i, p in enumerate(self.products, start=self.start):
            q, k, v = p["qkv"](h, h_scale).view(b, t, 3, heads, n // heads).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            o, o_scale = quantize_rows(o.transpose(1, 2))
            x, h, h_scale = add_norm_fp8(x, p["out"](o, o_scale).view(b, t, n), blocks[i].mlp_ln)
            f, f_scale = quantize_rows(p["fc1"](h, h_scale), gelu=True)
            y = p["fc2"](f, f_scale).view(b, t, n)
            if i < len(blocks) - 1:
                x, h, h_scale = add_norm_fp8(x, y, blocks[i + 1].attn_ln)
        return add_norm(x, y, ln_post)[1]
