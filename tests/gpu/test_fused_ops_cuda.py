"""engine/kernels/fused_ops.py on a GPU: the Triton add + layer norm, the GELU epilogue and the one-row product against
torch's operations; a lone row's chain of kernels launched as dependents against plain launches."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import decode_attention, fused_ops, int8_attention
from engine.kernels.fused_ops import add_norm, linear_gelu
from engine.kernels.options import KernelOptions


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_a_runs_product_written_in_place_is_the_product_of_those_rows(cuda, dtype):
    """linear_into (an encoder pass's run of one adapter's windows, engine/model/lora.py) writes into its rows of the
    pass's output what linear and linear_gelu give for those rows alone."""
    gen = torch.Generator(cuda).manual_seed(3)
    proj = nn.Linear(384, 1536, device=cuda, dtype=dtype).requires_grad_(False)
    x = torch.randn(5, 300, 384, device=cuda, dtype=dtype, generator=gen)
    for gelu in (False, True):
        out = torch.full((5, 300, 1536), float("nan"), device=cuda, dtype=dtype)
        for run in (slice(0, 2), slice(2, 3), slice(3, 5)):
            fused_ops.linear_into(proj, x[run], out[run], gelu)
            want = (linear_gelu if gelu else fused_ops.linear)(proj, x[run])
            assert torch.equal(out[run], want), (gelu, run)


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


@pytest.mark.parametrize("shape", [(1280, 1280), (384, 384), (512, 512), (1280, 5120), (384, 1536)])
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


@pytest.mark.parametrize("add", [True, False])
@pytest.mark.parametrize(
    "n,features,gelu", [(1280, 3840, False), (1280, 1280, False), (1280, 5120, True), (384, 1152, False), (384, 1536, True)]
)
def test_add_norm_linear_matches_the_separate_kernels(cuda, monkeypatch, add, n, features, gelu):
    """A lone sequence's fused add + norm + product against add_norm and the product it replaces: the residual
    stream bit for bit, the product within float16 rounding of the float32 reference, no further from it than
    the separate kernels' result."""
    gen = torch.Generator(cuda).manual_seed(n + features)
    x, y = (torch.randn(1, 1, n, device=cuda, generator=gen).half() * 4 for _ in "xy")
    ln = nn.LayerNorm(n, device=cuda, dtype=torch.float16)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(n, device=cuda, generator=gen))
        ln.bias.copy_(torch.randn(n, device=cuda, generator=gen))
    weight = (torch.randn(features, n, device=cuda, generator=gen) * 0.03).half()
    bias = (torch.randn(features, device=cuda, generator=gen) * 0.1).half()
    assert fused_ops.norm_product_applies(x, weight)
    with torch.no_grad():
        new_x, out = fused_ops.add_norm_linear(x, y if add else None, ln, weight, bias, gelu)
        ref_x, separate = fused_ops.add_norm_linear(x, y if add else None, ln, weight, bias, gelu, fused=False)
        h_out = torch.full_like(x, float("nan"))  # the normalized row, written too (what an adapter reads)
        again = fused_ops.add_norm_linear(x, y if add else None, ln, weight, bias, gelu, out_h=h_out)[1]
    assert torch.equal(new_x, ref_x) and torch.equal(again, out)
    want_h = fused_ops.norm(ln, ref_x)
    assert torch.allclose(h_out.float(), want_h.float(), atol=2e-2, rtol=1e-2), (h_out - want_h).abs().max()
    s = (x + y) if add else x
    h = F.layer_norm(s, (n,), ln.weight, ln.bias, ln.eps).float()  # the stored float16 row, in float32
    exact = F.linear(h, weight.float(), bias.float())
    exact = F.gelu(exact, approximate="tanh") if gelu else exact
    ours, theirs = (out.float() - exact).abs().max().item(), (separate.float() - exact).abs().max().item()
    assert ours <= theirs * 1.25 + 2e-3, (ours, theirs)


@pytest.mark.parametrize("vocab,n", [(51866, 1280), (51864, 384)])
def test_one_row_logits_match_cublas(cuda, vocab, n):
    """A lone sequence's vocabulary projection in one kernel, float32 out, against cuBLAS and the cast."""
    gen = torch.Generator(cuda).manual_seed(vocab)
    weight = (torch.randn(vocab, n, device=cuda, generator=gen) * 0.05).half()
    x = torch.randn(1, n, device=cuda, generator=gen).half()
    got, want = fused_ops.one_row_logits(x, weight), F.linear(x, weight).float()
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # both round their float32 sums to float16 (so equal logits tie the same way): one step of it apart at most
    assert (got - want).abs().max().item() <= 2e-3 * want.abs().max().item()
    assert torch.equal(got, got.half().float())
    assert fused_ops.one_row_logits(torch.randn(2, n, device=cuda).half(), weight) is None  # two rows: cuBLAS


def _decoder_like_chain(gen, n: int, layers: int):
    """Weights for `layers` rounds of what a lone row's decode step chains: product, add + norm + product (GELU),
    a wide product; each kernel reads the one before it's output."""
    def half(*shape, scale=0.03):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).half()

    rounds = []
    for _ in range(layers):
        ln = nn.LayerNorm(n, device="cuda", dtype=torch.float16)
        out = nn.Linear(n, n).to("cuda", torch.float16)
        fc2 = nn.Linear(4 * n, n).to("cuda", torch.float16)
        rounds.append((out, ln, half(4 * n, n), half(4 * n, scale=0.1), fc2))
    return rounds


def _run_chain(rounds, x, pdl: bool):
    for out, ln, fc1_w, fc1_b, fc2 in rounds:
        x, f = fused_ops.add_norm_linear(x, fused_ops.linear(out, x, pdl), ln, fc1_w, fc1_b, gelu=True, pdl=pdl)
        x = x + fused_ops.linear(fc2, f, pdl)
    return x


@pytest.mark.parametrize("graph", [False, True])
def test_dependent_launches_compute_what_plain_launches_do(cuda, monkeypatch, graph):
    """The one-row kernels with programmatic dependent launch (each reads its weight while the kernel before it
    runs) give bit for bit what they give launched one after the other, eagerly and replayed from a CUDA graph."""
    if torch.cuda.get_device_capability(cuda)[0] >= 9:
        assert fused_ops.pdl_applies(cuda)
    gen = torch.Generator(cuda).manual_seed(7)
    rounds = _decoder_like_chain(gen, 1280, 6)
    x = torch.randn(1, 1, 1280, device=cuda, generator=gen).half()
    with torch.no_grad():
        plain = _run_chain(rounds, x, pdl=False)
        if not graph:
            dependent = _run_chain(rounds, x, pdl=True)
        else:
            static = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                _run_chain(rounds, static, pdl=True)  # compiles outside the capture
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                result = _run_chain(rounds, static, pdl=True)
            for _ in range(3):
                g.replay()
            dependent = result.clone()
    assert torch.isfinite(plain).all()
    assert torch.equal(dependent, plain)


def _attention_layers(gen, n: int, heads: int, layers: int, keys: int):
    """Weights and caches for a lone row's self- and cross-attention sub-layers (the decoder's kernels)."""
    def half(*shape, scale=0.03):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).half()

    made = []
    for _ in range(layers):
        cross_k, cross_v = (torch.randn(1, heads, keys, n // heads, device="cuda", generator=gen) for _ in "kv")
        made.append(dict(
            ln1=nn.LayerNorm(n, device="cuda", dtype=torch.float16), qkv=(half(3 * n, n), half(3 * n)),
            out1=nn.Linear(n, n).to("cuda", torch.float16), ln2=nn.LayerNorm(n, device="cuda", dtype=torch.float16),
            q=(half(n, n), half(n)), out2=nn.Linear(n, n).to("cuda", torch.float16),
            cross=(*int8_attention.quantize(cross_k), *int8_attention.quantize(cross_v)),
        ))  # fmt: skip
    return made


def _attention_step(layers, x, self_caches, positions, pdl: bool):
    """One decode step of a lone row through the layers: x (1, 1, n) -> the residual stream after them."""
    y, kernels = None, KernelOptions(pdl=pdl)
    for layer, (k_cache, v_cache) in zip(layers, self_caches):
        heads = k_cache.shape[1]
        x, qkv = fused_ops.add_norm_linear(x, y, layer["ln1"], *layer["qkv"], pdl=pdl)
        o = decode_attention.self_attention_step(qkv, k_cache, v_cache, positions, 0, pdl)
        x, q = fused_ops.add_norm_linear(x, fused_ops.linear(layer["out1"], o, pdl), layer["ln2"], *layer["q"], pdl=pdl)
        kq, ks, vq, vs = layer["cross"]
        c = int8_attention.int8_attention(q.view(1, heads, 1, -1), kq, ks, vq, vs, kernels)  # the decoder's views
        y = fused_ops.linear(layer["out2"], c.view(1, 1, -1), pdl)
    return x + y


def test_lone_row_attention_as_dependents_matches_plain_launches(cuda, monkeypatch):
    """A lone row's decode steps with every kernel launched as a dependent (the attention kernels reading their
    caches before waiting) and replayed from a CUDA graph, against the same steps launched plainly: the self
    caches written alike and the outputs equal to the attention kernels' rounding, step after step."""
    if torch.cuda.get_device_capability(cuda)[0] < 9:
        pytest.skip("dependent launches need Hopper or later")
    gen = torch.Generator(cuda).manual_seed(11)
    n, heads, ctx = 1280, 20, 448
    layers = _attention_layers(gen, n, heads, 4, 1500)
    caches = [tuple(torch.randn(1, heads, ctx, 64, device=cuda, generator=gen).half() for _ in "kv") for _ in layers]
    inputs = [torch.randn(1, 1, n, device=cuda, generator=gen).half() for _ in range(5)]
    steps = list(zip([0, 1, 2, 127, 128], inputs))  # the prefetched positions' bound in the self-attention
    with torch.no_grad():
        plain_caches = [tuple(c.clone() for c in pair) for pair in caches]
        plain = [_attention_step(layers, x, plain_caches, torch.tensor([[p]], device=cuda), False) for p, x in steps]
        static_x, static_pos = inputs[0].clone(), torch.zeros(1, 1, dtype=torch.long, device=cuda)
        warm = [tuple(c.clone() for c in pair) for pair in caches]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _attention_step(layers, static_x, warm, static_pos, True)  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            result = _attention_step(layers, static_x, caches, static_pos, True)
        dependent = []
        for p, x in steps:
            static_x.copy_(x)
            static_pos.fill_(p)
            g.replay()
            dependent.append(result.clone())
    for got, want in zip(dependent, plain):
        assert torch.isfinite(want).all()
        assert (got.float() - want.float()).abs().max().item() < 1e-2 * want.float().abs().max().item()
    for (k, v), (pk, pv) in zip(caches, plain_caches):
        assert (k.float() - pk.float()).abs().max().item() < 1e-2 * pk.float().abs().max().item()
        assert (v.float() - pv.float()).abs().max().item() < 1e-2 * pv.float().abs().max().item()
