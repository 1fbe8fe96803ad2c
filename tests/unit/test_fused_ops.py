"""engine/kernels/fused_ops.py off a GPU: the same torch operations as the unfused model code, bit for bit."""

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.fused_ops import add_norm, linear_gelu


def test_add_norm_on_cpu_is_the_add_then_the_norm():
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randn(2, 5, 384, generator=gen) for _ in "xy")
    ln = nn.LayerNorm(384)
    with torch.no_grad():
        ln.weight.normal_(generator=gen)
        ln.bias.normal_(generator=gen)
    new_x, h = add_norm(x, y, ln)
    assert torch.equal(new_x, x + y)
    assert torch.equal(h, F.layer_norm(x + y, (384,), ln.weight, ln.bias, ln.eps))


def test_linear_gelu_on_cpu_is_exact_gelu():
    gen = torch.Generator().manual_seed(1)
    proj = nn.Linear(64, 256)
    x = torch.randn(3, 64, generator=gen) * 3
    with torch.no_grad():
        assert torch.equal(linear_gelu(proj, x), F.gelu(proj(x)))


def test_float8_encoder_is_refused_where_it_cannot_run():
    import pytest

    from engine.config import EngineConfig
    from engine.kernels import fp8
    from engine.runtime.model_runner import ModelRunner

    assert "CUDA" in fp8.unsupported_reason(torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="encoder_precision"):
        EngineConfig(encoder_precision="float4")
    with pytest.raises(ValueError, match="encoder_precision float8: .*CUDA GPU"):
        ModelRunner(EngineConfig(model="tiny.en", device="cpu", encoder_precision="float8"))
