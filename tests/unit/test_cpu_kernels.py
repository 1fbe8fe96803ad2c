"""Native CPU decode kernels: built and loaded where a C compiler and AVX2 exist, sharing torch's OpenMP runtime,
and the same numbers as torch for the products, the attentions and a whole decode step of one or several sequences."""

import ast
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import cpu_kernels
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper

ROOT = Path(__file__).resolve().parents[2]

native = pytest.mark.skipif(
    platform.machine() != "x86_64"
    or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512")
    or not (shutil.which("cc") or shutil.which("gcc")),
    reason="the kernels need x86-64 with AVX2 and a C compiler to build them",
)


@pytest.fixture(scope="module")
def kernels():
    k = cpu_kernels.load()
    assert k is not None, "kernels did not build: see the log"
    return k


@native
def test_one_openmp_runtime(kernels):
    # A second runtime would bring a second thread team competing for the same cores. Checked in a fresh
    # process: this one may hold CTranslate2's own runtime too (the faster-whisper peer of other tests).
    script = (
        "import torch\nfrom engine.kernels import cpu_kernels\nassert cpu_kernels.load() is not None\n"
        "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l or 'libiomp' in l}))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    mapped = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert len(mapped) == 1, mapped
    # here too the kernels bind to torch's runtime, whatever else this process has loaded
    assert cpu_kernels.torch_openmp_library() == mapped[0]


@native
@pytest.mark.parametrize("k, n", [(384, 384), (384, 1152), (1536, 384), (1280, 5120)])
@torch.inference_mode()
def test_linear_matches_torch(kernels, k, n):
    x, w, b, r = torch.randn(1, 1, k), torch.randn(n, k), torch.randn(n), torch.randn(1, 1, n)
    w_t = w.t().contiguous()
    assert kernels.supports_linear(w_t) and not kernels.supports_linear(w.t())
    torch.testing.assert_close(kernels.linear(x, w_t, b), F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kernels.linear(x, w_t, None, residual=r), F.linear(x, w) + r, rtol=1e-4, atol=1e-4)
    ln = torch.nn.LayerNorm(k)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    want = F.gelu(F.linear(ln(x * 5 + 3), w, b))  # off-centre input: the norm must centre it
    got = kernels.linear(x * 5 + 3, w_t, b, norm=ln, gelu=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@native
@pytest.mark.parametrize("heads, n, capacity", [(6, 1, 448), (6, 37, 448), (20, 1500, 1500)])
def test_attend_one_matches_sdpa(kernels, heads, n, capacity):
    q = torch.randn(heads, 64) * 3  # large scores: the softmax must subtract its maximum
    k, v = torch.randn(heads, capacity, 64), torch.randn(heads, capacity, 64)
    assert kernels.supports_attention(k, v)
    want = F.scaled_dot_product_attention(q[:, None], k[:, :n], v[:, :n])[:, 0]
    torch.testing.assert_close(kernels.attend_one(q, k, v, n), want, rtol=1e-4, atol=1e-4)


@native
@pytest.mark.parametrize("rows", [2, 5])
def test_attend_rows_matches_sdpa(kernels, rows):
    heads, ctx, d = 6, 448, 64
    k_cache, v_cache = torch.randn(rows + 2, heads, ctx, d), torch.randn(rows + 2, heads, ctx, d)
    k, v = k_cache[1 : rows + 1], v_cache[1 : rows + 1]  # slots 1..rows: the slot offset must be honoured
    # cross-attention: every row against the first n positions of its slot
    q = torch.randn(rows, heads * d) * 3
    want = F.scaled_dot_product_attention(q.view(rows, heads, 1, d), k[:, :, :37], v[:, :, :37])
    torch.testing.assert_close(kernels.attend_rows(q, k, v, 37), want.reshape(rows, -1), rtol=1e-4, atol=1e-4)
    # self-attention: each row writes its new key/value at its own position, then attends over 0..p
    qkv = torch.randn(rows, 3 * heads * d) * 3
    positions = torch.tensor([0, 447, 12, 3, 100][:rows])
    before_k, before_v = k_cache.clone(), v_cache.clone()
    got = kernels.attend_rows(qkv, k, v, ctx, positions=positions)
    q, k_new, v_new = qkv.view(rows, 3, heads, d).unbind(1)
    for r, p in enumerate(positions.tolist()):
        before_k[1 + r, :, p], before_v[1 + r, :, p] = k_new[r], v_new[r]
        want = F.scaled_dot_product_attention(q[r, :, None], before_k[1 + r, :, : p + 1], before_v[1 + r, :, : p + 1])
        torch.testing.assert_close(got[r], want.reshape(-1), rtol=1e-4, atol=1e-4)
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)  # those writes and no others


def tiny_model_for_kernels(kernels) -> Whisper:
    """tiny's shapes with random weights, laid out for the CPU kernels as the engine does."""
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    model.eval().requires_grad_(False)
    model.decoder.fuse_qkv(input_major=True)
    model.decoder.prepare_for_cpu(kernels)
    return model


@native
def test_decode_step_matches_torch_path(kernels):
    model = tiny_model_for_kernels(kernels)
    dims, dec = model.dims, model.decoder
    assert dec.cpu_kernels is kernels
    shape = CacheShape.for_model(dims, None, None)
    caches = [KVCache(shape, 3, torch.float32, torch.device("cpu")) for _ in range(2)]
    with torch.inference_mode():
        features = model.encoder(torch.randn(1, dims.n_mels, 3000))
        for cache in caches:
            dec.fill_cross_cache(features, cache, 2)  # the last slot: slot offsets must be honoured
        assert dec._kernels_apply(caches[1])  # else both runs below would take the torch path
        out = []
        for use, cache in zip((None, kernels), caches):
            dec.cpu_kernels = use
            prompt = enumerate([50257, 50362, 440, 2068])
            steps = [dec(torch.tensor([[t]]), torch.tensor([[p]]), cache, 2, p + 1, None, p) for p, t in prompt]
            out.append(torch.cat([dec.logits(s[:, -1]) for s in steps]))
        dec.cpu_kernels = kernels
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1].self_kv, caches[0].self_kv, rtol=1e-5, atol=1e-5)
    assert caches[1].self_kv[:, :, :2].abs().sum() == 0  # other slots untouched


@native
def test_decode_step_of_several_rows_matches_torch_path(kernels, monkeypatch):
    model = tiny_model_for_kernels(kernels)
    dims, dec = model.dims, model.decoder
    shape = CacheShape.for_model(dims, None, None)
    caches = [KVCache(shape, 6, torch.float32, torch.device("cpu")) for _ in range(2)]
    rows_taken = []
    step_rows = dec._step_rows
    monkeypatch.setattr(dec, "_step_rows", lambda *a: rows_taken.append(a[0].shape[0]) or step_rows(*a))
    with torch.inference_mode():
        features = model.encoder(torch.randn(4, dims.n_mels, 3000))
        for cache in caches:
            dec.fill_cross_cache(features, cache, 1)  # slots 1..4
        out = []
        for use, cache in zip((None, kernels), caches):
            dec.cpu_kernels = use
            logits = []
            for step in range(4):  # four sequences at different positions, as after staggered admissions
                tokens = torch.tensor([[50257 + step], [440], [2068 + step], [50362]])
                positions = torch.tensor([[step], [step + 3], [step + 9], [step + 1]])
                mask = (torch.arange(16) <= positions[:, :, None])[:, None]
                logits.append(dec.logits(dec(tokens, positions, cache, 1, 16, mask)[:, -1]))
            out.append(torch.cat(logits))
        dec.cpu_kernels = kernels
    assert rows_taken == [4] * 4  # the kernel path ran for the second engine, not the first
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1].self_kv, caches[0].self_kv, rtol=1e-5, atol=1e-5)
    assert caches[1].self_kv[:, :, 0].abs().sum() == 0 and caches[1].self_kv[:, :, 5].abs().sum() == 0


def test_off_switch(monkeypatch):
    monkeypatch.setenv("WHISPER_CPU_KERNELS", "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
    finally:
        monkeypatch.delenv("WHISPER_CPU_KERNELS")
        cpu_kernels.load.cache_clear()


@native
def test_prebuilt_library_needs_no_compiler(kernels, monkeypatch, tmp_path):
    # the Docker image builds the kernels at image build time and removes the compiler
    monkeypatch.setenv("WHISPER_KERNEL_CACHE", str(tmp_path))
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is not None  # builds into tmp_path
        cpu_kernels.load.cache_clear()
        monkeypatch.setattr(cpu_kernels, "_compiler", lambda: None)
        assert cpu_kernels.load() is not None  # found there, not rebuilt
        cpu_kernels.load.cache_clear()
        monkeypatch.setenv("WHISPER_KERNEL_CACHE", str(tmp_path / "empty"))
        assert cpu_kernels.load() is None  # nothing built and no compiler: torch alone
    finally:
        cpu_kernels.load.cache_clear()
