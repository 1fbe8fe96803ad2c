"""engine/fused_ops.py on a GPU: the Triton add + layer norm, the GELU epilogue and the one-row product against
torch's operations."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import fused_ops
from engine.fused_ops import add_norm, linear_gelu


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1, 1280), (7, 1, 384), (2, 1500, 1280), (3, 5, 512)])
def test_add_norm_matches_torch(cuda, dtype, shape):
    assert fused_ops.triton is not None
    gen = torch.Generator(cuda).manual_seed(0)
    n = shape[-1]
    x, y = (torch.randn(shape, device=cuda, generator=gen).to(dtype) * 4 for _ in "xy")
    ln = nn.LayerNorm(n, device=cuda, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(n, device=cuda, generator=gen))
        ln.bias.copy_(torch.randn(n, device=cuda, generator=gen))
    new_x, h = add_norm(x, y, ln)
    assert torch.equal(new_x, x + y)  # the stream is rounded exactly as torch's add rounds it
    ref = F.layer_norm((x + y).float(), (n,), ln.weight.float(), ln.bias.float(), ln.eps)
    ours, torchs = (h.float() - ref).abs().max().item(), (F.layer_norm(x + y, (n,), ln.weight, ln.bias).float() - ref).abs().max().item()
    # no worse than torch's own kernel in this dtype, up to one rounding step of the output
    assert ours <= torchs + (4e-3 if dtype == torch.float16 else 1e-5), (ours, torchs)


def test_add_norm_falls_back_for_views(cuda):
    x = torch.randn(4, 8, 64, device=cuda, dtype=torch.float16).transpose(0, 1)  # not contiguous
    y = torch.randn_like(x)
    ln = nn.LayerNorm(64, device=cuda, dtype=torch.float16)
    new_x, h = add_norm(x, y, ln)
    assert torch.equal(new_x, x + y) and torch.equal(h, ln(x + y))


@pytest.mark.parametrize("rows", [1, 256, 48000])
def test_gelu_epilogue_is_as_close_as_the_separate_gelu(cuda, rows):
    gen = torch.Generator(cuda).manual_seed(0)
    proj = nn.Linear(1280, 5120, device=cuda, dtype=torch.float16)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(5120, 1280, device=cuda, generator=gen) * 0.03)
        proj.bias.copy_(torch.randn(5120, device=cuda, generator=gen) * 0.1)
    x = torch.randn(rows, 1280, device=cuda, generator=gen).half()
    with torch.no_grad():
        ref = F.gelu(F.linear(x.float(), proj.weight.float(), proj.bias.float()))  # exact (erf) GELU in float32
        fused = (linear_gelu(proj, x).float() - ref).abs().max().item()
        separate = (F.gelu(proj(x)).float() - ref).abs().max().item()
    assert fused <= separate * 1.25 + 1e-3, (fused, separate)


@pytest.mark.parametrize("shape", [(1280, 1280), (384, 384), (512, 512)])
def test_one_row_linear_matches_cublas(cuda, shape):
    """The one-row product (a lone sequence's decode step) against F.linear: float32 sums in another order."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(shape[1], shape[0]).to("cuda", torch.float16)
    x = torch.randn(1, 1, shape[1], device="cuda", dtype=torch.float16)
    got, want = fused_ops.linear(proj, x), F.linear(x, proj.weight, proj.bias)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got.float() - want.float()).abs().max().item() <= 2e-3 * want.float().abs().max().item()
    two = torch.randn(2, 1, shape[1], device="cuda", dtype=torch.float16)
    assert torch.equal(fused_ops.linear(proj, two), F.linear(two, proj.weight, proj.bias))  # cuBLAS from 2 rows
