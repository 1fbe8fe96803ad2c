"""dtype int8 on a CPU: the encoder's integer products, which checkpoints compute in int8 by default, and where
int8 is refused; the OpenMP spin default the server sets before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from engine.backends.cpu_int8_encoder import Int8Blocks, Int8Linear, quantize_rows
from engine.model.dims import DUMMY_DIMS
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper
from engine.runtime.model_runner import resolve_dtype, resolve_int8_weights
from server.openmp import SPIN_COUNT, set_spin_default

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_quantize_rows_keeps_each_row_within_half_a_step():
    x = torch.randn(37, 384) * torch.logspace(-3, 2, 37)[:, None]  # rows of very different magnitudes
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and scale.shape == (37, 1)
    assert q.abs().amax(dim=1).eq(127).all()  # each row's largest magnitude lands on 127
    assert ((q.float() * scale - x).abs() <= scale / 2 + 1e-6).all()


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_the_integer_product_rescaled(bias):
    """The products are exact in integers: the result equals float32's product of the dequantized operands up to
    the float32 rounding of the rescale."""
    torch.manual_seed(0)
    linear = nn.Linear(384, 1152, bias=bias)
    product = Int8Linear(linear.weight, linear.bias)
    rows, scales = quantize_rows(torch.randn(1500, 384))
    want = (rows.float() * scales) @ (product.values.float() * product.scales)
    if bias:
        want = want + linear.bias
    torch.testing.assert_close(product(rows, scales), want, rtol=1e-5, atol=1e-5)


def test_a_cpu_without_a_fast_integer_product_multiplies_the_same_integers_in_float32(monkeypatch):
    """Where torch._int_mm is slower than float32's product (no VNNI or AMX), the integer operands are multiplied in
    float32: bitwise the integer product's result while the sums stay within float32's 24 bits (here 384 products
    of at most 127 x 127)."""
    from engine.backends import cpu_int8_encoder

    torch.manual_seed(1)
    linear = nn.Linear(384, 1152)
    rows, scales = quantize_rows(torch.randn(1500, 384))
    got = {}
    for fast in (True, False):
        monkeypatch.setattr(cpu_int8_encoder, "integer_products_fast", lambda fast=fast: fast)
        product = Int8Linear(linear.weight, linear.bias)
        assert (product.float_values is None) == fast
        got[fast] = product(rows, scales)
    assert torch.equal(got[True], got[False])


def test_int8_encoder_is_close_to_float32():
    """tiny's shapes, seeded weights: the int8 encoder's output within a few percent of float32's (on real speech
    CTranslate2's int8 encoder is 6.1% away from its float32 one, ours 6.3%: benchmarks/cpu_int8.py's notes)."""
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    model.eval().requires_grad_(False)
    mel = torch.randn(2, dims.n_mels, 3000)
    encoder = model.encoder
    with torch.inference_mode():
        want = encoder(mel)
        encoder.use_quantized(Int8Blocks(encoder.blocks))
        got = encoder(mel)
    assert encoder.quantized_start == 0 and not hasattr(encoder.blocks[0], "mlp")  # the float32 weights are freed
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()).item() < 0.1
    for i in range(2):  # a window's result does not depend on the other window in the batch
        with torch.inference_mode():
            alone = encoder(mel[i : i + 1])
        torch.testing.assert_close(alone[0], got[i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("dtype", "device", "quantization", "int8"),
    [
        ("auto", CPU, "int8", True),  # an int8 checkpoint: its weights as stored
        ("auto", CPU, None, False),  # a float checkpoint stays float32 unless asked
        ("auto", CPU, "int16", False),
        ("int8", CPU, None, True),
        ("float32", CPU, "int8", False),  # asked for float32: the dequantized weights
        ("auto", CUDA, "int8", False),
    ],
)
def test_which_checkpoints_compute_in_int8(dtype, device, quantization, int8):
    assert resolve_int8_weights(dtype, device, quantization) is int8


def test_int8_is_a_cpu_dtype():
    assert resolve_dtype("int8", CPU) == torch.float32  # activations stay float32
    with pytest.raises(ValueError, match="int8 is a CPU mode"):
        resolve_dtype("int8", CUDA)


def test_spin_default_leaves_an_operators_setting_alone():
    env: dict[str, str] = {}
    set_spin_default(env)
    assert env == {"GOMP_SPINCOUNT": SPIN_COUNT}
    for own in ({"GOMP_SPINCOUNT": "0"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(own)
        set_spin_default(env)
        assert env == own


def test_server_entry_sets_the_spin_count_before_torch_loads():
    """`python -m server` (and the console script, the same module) sets it when it starts, before anything imports
    torch (the engine's names load on first use), so libgomp reads it when it loads, and engine processes inherit
    it."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    order = (
        "import builtins, os; seen = []\n"
        "real = builtins.__import__\n"
        "def spy(name, *a, **k):\n"
        "    if name == 'torch' and not seen: seen.append(os.environ.get('GOMP_SPINCOUNT'))\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = spy\n"
        "import server.__main__\n"
        "import server.settings, server.protocol\n"  # what serve imports before torch (the engine loads it late)
        "import torch\n"
        "print(seen[0])"
    )
    out = subprocess.run([sys.executable, "-c", order], env=env, capture_output=True, text=True, check=False)
    assert out.stdout.split()[-1] == SPIN_COUNT, out.stderr
