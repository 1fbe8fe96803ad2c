"""The layer operations the model's reference computation goes through, as plain torch: a residual add with the
layer norm after it, a layer norm, a product, a product with GELU, the encoder's attention and its convolutions. A backend chosen at start-up may give the
model other functions for the same operations (LayerOps): the GPU backend gives it fused kernels
(engine/backends/gpu.py, engine/kernels/fused_ops.py). Functions, not module calls: a decode step is ~100 small
operations, and nn.Module.__call__'s dispatch costs ~11 us each on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class LayerOps:
    add_norm: Callable[[Tensor, Tensor, nn.LayerNorm], tuple[Tensor, Tensor]]  # (x + y, ln(x + y))
    norm: Callable[[nn.LayerNorm, Tensor], Tensor]  # ln(x)
    linear: Callable[..., Tensor]  # (proj, x, pdl=True) -> proj(x); `pdl` is a GPU launch option
    linear_gelu: Callable[[nn.Linear, Tensor], Tensor]  # gelu(proj(x))
    attention: Callable[[Tensor, Tensor, Tensor], Tensor] = F.scaled_dot_product_attention  # unmasked (q, k, v)
    conv1d: Callable[[nn.Conv1d, Tensor], Tensor] = nn.Conv1d.__call__  # conv(x), x (batch, channels, time)
    qkv: Callable[[nn.Module, Tensor], Tensor] = lambda attn, x: attn.qkv(x)  # [q | k | v] of a self-attention
    gelu: Callable[[Tensor], Tensor] = F.gelu  # GELU as linear_gelu computes it, for a product finished apart
    # (proj, x, out, with_gelu) -> None: linear (with_gelu: linear_gelu) written into `out`, a contiguous tensor of
    # the output's shape (a run of a pass's windows, engine/model/lora.py); None where the backend's products cannot
    linear_into: Callable[..., None] | None = None


class Projection(NamedTuple):
    """A weight and bias that no nn.Linear holds (a fused q/k/v), for the `linear` operations."""

    weight: Tensor
    bias: Tensor | None


def add_norm(x: Tensor, y: Tensor, ln: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    """(x + y, ln(x + y)): the residual stream after a sub-layer and the next sub-layer's input."""
    x = x + y
    return x, F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def linear(proj: nn.Linear, x: Tensor, pdl: bool = True) -> Tensor:
    return F.linear(x, proj.weight, proj.bias)


def linear_gelu(proj: nn.Linear, x: Tensor) -> Tensor:
    return F.gelu(F.linear(x, proj.weight, proj.bias))


def linear_into(proj: nn.Linear, x: Tensor, out: Tensor, with_gelu: bool = False) -> None:
    rows, dest = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
    if proj.bias is None:
        torch.mm(rows, proj.weight.t(), out=dest)
    else:
        torch.addmm(proj.bias, rows, proj.weight.t(), out=dest)
    if with_gelu:
        dest.copy_(F.gelu(dest))


TORCH_OPS = LayerOps(add_norm=add_norm, norm=norm, linear=linear, linear_gelu=linear_gelu, linear_into=linear_into)
