"""Float8 products for the encoder (opt-in: `EngineConfig.encoder_precision = "float8"`).

At high concurrency the encoder is ~40% of a GPU's time (large-v3, 256 windows on an H200) and ~80% of it is four
products per layer over 1,500 rows per window, which cuBLAS runs at ~680 TFLOP/s in float16. The same products in
float8 e4m3 (`torch._scaled_mm`, Hopper's and Ada's FP8 tensor cores) take 0.5-0.6x the time (48,000 rows:
873 -> 519 us for 1,280 -> 5,120 with its bias, 917 -> 467 us for 5,120 -> 1,280; H200, BENCHMARKS.md).

Scaling: each weight's output feature (row) and each activation row (a time step of one window) gets its own
scale, amax / 448 (e4m3's largest value), so one loud frame does not flatten the others. The activation side is
quantized where it is produced (engine/kernels/fused_ops.py): by the residual add + layer norm before the attention and
the MLP, by the GELU after the MLP's first product, and while reading the attention output in place; the products
write float16 with the bias added. Attention itself, the convolutions, the norms, the decoder and the first blocks
(below) stay in the model's precision.

The cost is precision: a product's relative error is ~3.7% on Gaussian data (against ~0.1% in float16); what that
does to transcripts is measured on real weights (tests/gpu/test_fp8_encoder.py, BENCHMARKS.md). It stays opt-in.

The first MODEL_DTYPE_BLOCKS blocks keep the model's dtype. Whisper's encoder has attention-sink frames: a few MLP
units act as a switch, far off on most frames and strongly on for some (padding, fixed positions), and later blocks
attend to those frames. The error of float8 early on flips that switch on a few frames per window, which then come
out unrelated to their float16 selves (cosine ~-0.2). With every block in float8, a CPU emulation of these products
on the test clips gave 39 such frames (cosine < 0.9) of 39,000 for tiny.en and 874 for base, whose sinks form in
four of six blocks; with the first two blocks in float32, 4 and 7, and base's first-percentile frame cosine went
from 0.61 to 0.996 (BENCHMARKS.md); on the GPU, tiny.en's output on a real clip moved 4.2% from float16 instead
of 8.9%. Word error rates did not move measurably either way; the encoder output did. On large-v3 two blocks are
1/16 of the products.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.kernels import fused_ops

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
