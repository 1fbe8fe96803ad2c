"""Native CPU decode kernels: built and loaded where a C compiler and AVX2 exist, sharing torch's OpenMP runtime,
and the same numbers as torch for the products, the attentions and a whole decode step of one or several sequences."""

import ast
import copy
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.backends import select_backend
from engine.backends.cpu import CpuNativeBackend, CpuTorchBackend, lay_out_for_cpu
from engine.kernels import cpu_kernels
from engine.kernels.cpu_kernels import BlockedWeight, QuantizedWeight
from engine.kernels.options import KernelOptions
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
    torch.manual_seed(k + n)
    x, w, b, r = torch.randn(1, 1, k), torch.randn(n, k), torch.randn(n), torch.randn(1, 1, n)
    w_t = w.t().contiguous()
    assert kernels.supports_linear(w_t) and not kernels.supports_linear(w.t())
    # float32 sums of k products in another order: their round-off grows with k (1.2e-4 seen once at k = 1280
    # on unseeded inputs, against a bound of 1e-4 made for k = 384)
    tol = 1e-4 * max(1.0, k / 384)
    torch.testing.assert_close(kernels.linear(x, w_t, b), F.linear(x, w, b), rtol=tol, atol=tol)
    torch.testing.assert_close(kernels.linear(x, w_t, None, residual=r), F.linear(x, w) + r, rtol=tol, atol=tol)
    ln = torch.nn.LayerNorm(k)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    want = F.gelu(F.linear(ln(x * 5 + 3), w, b))  # off-centre input: the norm must centre it
    got = kernels.linear(x * 5 + 3, w_t, b, norm=ln, gelu=True)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@native
@pytest.mark.parametrize("rows", [1, 2, 5])
@torch.inference_mode()
def test_linear_rows_matches_torch_for_float_and_int8_weights(kernels, rows):
    """Several rows through one product (each weight read once for all of them), float32 weights and int8 ones,
    with the LayerNorm, GELU, bias and residual a decode step fuses into it."""
    torch.manual_seed(rows)
    k, n = 384, 1152
    x, w, b, r = torch.randn(rows, k) * 5 + 3, torch.randn(n, k) * 0.05, torch.randn(n), torch.randn(rows, n)
    ln = torch.nn.LayerNorm(k)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    q = QuantizedWeight.of(w.t())
    dequantized = (q.dense().float() * q.scales).t()  # what the int8 weights stand for
    for weight, want_w in ((w.t().contiguous(), w), (q, dequantized)):
        torch.testing.assert_close(kernels.linear_rows(x, weight, b, residual=r), F.linear(x, want_w, b) + r,
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        got = kernels.linear_rows(x, weight, b, norm=ln, gelu=True)
        torch.testing.assert_close(got, F.gelu(F.linear(ln(x), want_w, b)), rtol=1e-4, atol=1e-4)
    # one row: the same as the single-row int8 kernel's
    torch.testing.assert_close(kernels.linear_q8(x[:1], q, b), F.linear(x[:1], dequantized, b), rtol=1e-4, atol=1e-4)


def test_quantized_weights_of_an_int8_checkpoint_are_its_integers():
    """CTranslate2 stores int8 rows with a scale each (weight = q / scale); dequantized at load, they quantize back
    to exactly those integers, so the int8 kernels compute with the checkpoint's own weights."""
    torch.manual_seed(0)
    q = torch.randint(-127, 128, (384, 1152), dtype=torch.int8)
    q[0] = 127  # every output's largest magnitude is 127, as CTranslate2's quantization makes it
    scale = torch.rand(1152) * 100 + 10  # CTranslate2's: 127 / the row's largest magnitude
    dequantized = q.float() / scale  # (in, out) input-major, as the kernels read it
    got = QuantizedWeight.of(dequantized)
    assert torch.equal(got.dense(), q)
    torch.testing.assert_close(got.scales, 1 / scale)
    padded = QuantizedWeight.of(dequantized, 1216)
    assert padded.shape == (384, 1216) and not padded.dense()[:, 1152:].any()


def test_interleaved_weights_hold_the_same_integers():
    """The integer dot products' layout (four inputs' bytes side by side per output) holds the same integers and
    scales, and each output's sum of integers."""
    torch.manual_seed(1)
    w = torch.randn(1152, 384)
    plain, interleaved = QuantizedWeight.of(w.t(), 1216), QuantizedWeight.of(w.t(), 1216, interleave=True)
    assert interleaved.shape == plain.shape == (384, 1216)
    assert torch.equal(interleaved.dense(), plain.dense()) and torch.equal(interleaved.scales, plain.scales)
    assert torch.equal(interleaved.sums, plain.dense().sum(dim=0, dtype=torch.int32))
    assert plain.sums is None


def quantized_rows_reference(x, q, bias, residual=None, norm=None, gelu=False):
    """What the integer dot products compute: each row quantized to int8 (a scale per row, its largest magnitude
    over 127, rounded to nearest even), the integer sums exactly (float64 holds them), then both scales, bias,
    GELU, residual. The float32 operations are the kernels' one by one, so without the norm and GELU (torch's own
    there, not the kernels') the outputs are bit for bit theirs."""
    x = norm(x) if norm is not None else x
    sx = x.abs().amax(dim=1, keepdim=True) / 127
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    xq = torch.round(x * (1 / sx))
    y = (xq.double() @ q.dense().double()).float() * (sx * q.scales)
    y = y + bias if bias is not None else y
    y = F.gelu(y) if gelu else y
    return y + residual if residual is not None else y


def dot_forms(kernels) -> list[str]:
    """The integer dot products' forms this CPU runs: the AVX2 one everywhere the kernels load, VNNI's where it has
    it."""
    return ["avx2", "vnni"] if kernels.vnni else ["avx2"]


@native
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("k, n", [(384, 448), (384, 1152), (1536, 448), (1536, 1152), (388, 64)])
@torch.inference_mode()
def test_integer_dot_products_are_the_quantized_rows_products(kernels, monkeypatch, rows, k, n):
    """int8 weights laid out for the integer dot products: one row's product and several rows' are the products of
    the rows quantized to int8, with the LayerNorm, GELU, bias and residual a step fuses into them. Each form the
    CPU runs (VNNI, AVX2) gives the reference's bits where no norm or GELU comes in, and both the same bits always:
    an engine's tokens do not depend on which CPU it runs on."""
    torch.manual_seed(rows * k + n)  # 388 inputs: the row quantization's tail (fewer than 8 inputs) too
    x, w, b, r = torch.randn(rows, k) * 5 + 3, torch.randn(n, k) * 0.05, torch.randn(n), torch.randn(rows, n)
    ln = torch.nn.LayerNorm(k)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    q = QuantizedWeight.of(w.t(), interleave=True)
    fused = ({}, {"residual": r}, {"norm": ln, "gelu": True}, {"norm": ln, "residual": r})
    dequantized = (q.dense().float() * q.scales).t()  # the float product it stands for, within the rows' rounding
    outputs = []
    for form in dot_forms(kernels):
        monkeypatch.setattr(kernels, "dot_form", form)
        got = [kernels.linear_rows(x, q, b, **f) for f in fused]
        assert torch.equal(kernels.linear_rows(x, q, None), quantized_rows_reference(x, q, None))
        assert torch.equal(got[0], quantized_rows_reference(x, q, b))
        assert torch.equal(got[1], quantized_rows_reference(x, q, b, residual=r))
        for f, y in zip(fused[2:], got[2:]):  # torch's LayerNorm and GELU round otherwise than the kernels'
            torch.testing.assert_close(y, quantized_rows_reference(x, q, b, **f), rtol=1e-5, atol=1e-5)
        assert torch.equal(kernels.linear_q8(x[:1], q, b), got[0][:1])  # one row: the same kernel's first row
        want = F.linear(x, dequantized, b)  # the rows' rounding: a step of 1/127 of their largest magnitude, ~1%
        assert (got[0] - want).norm() < 0.02 * want.norm()
        outputs.append(got)
    for other in outputs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[0], other))


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
    # rows reading cross slots by index, each slot its own count of positions (short contexts)
    slots, lengths = torch.tensor([2, 0, 1, 2, 0][:rows]), torch.tensor([448, 20, 150])
    got = kernels.attend_rows(q, k_cache, v_cache, ctx, cross_slots=slots, lengths=lengths)
    for r, slot in enumerate(slots.tolist()):
        n = int(lengths[slot])
        want = F.scaled_dot_product_attention(q[r].view(heads, 1, d), k_cache[slot, :, :n], v_cache[slot, :, :n])
        torch.testing.assert_close(got[r], want.reshape(-1), rtol=1e-4, atol=1e-4)
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


def tiny_backends(kernels) -> tuple[Whisper, CpuTorchBackend, CpuNativeBackend]:
    """tiny's shapes with random weights, laid out for the CPU kernels as the engine does, and the two CPU backends
    over them: torch's operations and the native kernels."""
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    model.eval().requires_grad_(False)
    chosen = select_backend(model, torch.device("cpu"), torch.float32, False, KernelOptions())
    assert isinstance(chosen, CpuNativeBackend) and chosen.native is kernels
    return model, CpuTorchBackend(model, KernelOptions(), chosen.output_chunks), chosen


@native
def test_decode_step_matches_torch_path(kernels):
    model, torch_path, native_path = tiny_backends(kernels)
    dims, dec = model.dims, model.decoder
    shape = CacheShape.for_model(dims, None, None)
    caches = [KVCache(shape, 3, torch.float32, torch.device("cpu")) for _ in range(2)]
    with torch.inference_mode():
        features = model.encoder(torch.randn(1, dims.n_mels, 3000))
        for cache in caches:
            dec.fill_cross_cache(features, cache, 2)  # the last slot: slot offsets must be honoured
        out = []
        for backend, cache in zip((torch_path, native_path), caches):
            prompt = enumerate([50257, 50362, 440, 2068])
            steps = [backend.eager_step(torch.tensor([[t]]), torch.tensor([[p]]), cache, [p], 2) for p, t in prompt]
            out.append(torch.cat([backend.logits(s[:, -1]) for s in steps]))
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1].self_kv, caches[0].self_kv, rtol=1e-5, atol=1e-5)
    assert caches[1].self_kv[:, :, :2].abs().sum() == 0  # other slots untouched


@native
def test_decode_step_of_several_rows_matches_torch_path(kernels, monkeypatch):
    model, torch_path, native_path = tiny_backends(kernels)
    dims, dec = model.dims, model.decoder
    shape = CacheShape.for_model(dims, None, None)
    caches = [KVCache(shape, 6, torch.float32, torch.device("cpu")) for _ in range(2)]
    rows_taken = []
    step_rows = native_path._step_rows
    monkeypatch.setattr(native_path, "_step_rows", lambda *a: rows_taken.append(a[0].shape[0]) or step_rows(*a))
    with torch.inference_mode():
        features = model.encoder(torch.randn(4, dims.n_mels, 3000))
        for cache in caches:
            dec.fill_cross_cache(features, cache, 1)  # slots 1..4
        out = []
        for backend, cache in zip((torch_path, native_path), caches):
            logits = []
            for step in range(4):  # four sequences at different positions, as after staggered admissions
                tokens = torch.tensor([[50257 + step], [440], [2068 + step], [50362]])
                positions = torch.tensor([[step], [step + 3], [step + 9], [step + 1]])
                hidden = backend.eager_step(tokens, positions, cache, positions.flatten().tolist(), 1)
                logits.append(backend.logits(hidden[:, -1]))
            out.append(torch.cat(logits))
    assert rows_taken == [4] * 4  # the kernel path ran for the second backend, not the first
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(caches[1].self_kv, caches[0].self_kv, rtol=1e-5, atol=1e-5)
    assert caches[1].self_kv[:, :, 0].abs().sum() == 0 and caches[1].self_kv[:, :, 5].abs().sum() == 0


@native
def test_int8_decode_steps_match_the_dequantized_float_ones(kernels):
    """KernelOptions.cpu_int8_weights on weights that are an int8 checkpoint's (integers times a scale per output):
    one row's steps and several rows' give the float path's logits, up to the sums' rounding; with the integer dot
    products (where the CPU has them) up to the rows' quantization too."""
    model, _, float_path = tiny_backends(kernels)
    dec = model.decoder
    with torch.no_grad():  # make every decoder product an int8 checkpoint's, as the int8 kernels will read it
        for block in dec.blocks:
            for w in (block.attn.qkv_weight, block.attn.out.weight, block.cross_attn.query.weight,
                      block.cross_attn.out.weight, block.mlp[0].weight, block.mlp[2].weight):  # fmt: skip
                q = QuantizedWeight.of(w.t())
                w.copy_((q.dense().float() * q.scales).t())
        q = QuantizedWeight.of(dec.token_embedding.weight.t())
        dec.token_embedding.weight.copy_((q.dense().float() * q.scales)[:, : dec.token_embedding.weight.shape[0]].t())
    chunks = lay_out_for_cpu(dec, native=True)  # the one-row vocabulary projection's blocks, of the new embedding
    float_path = CpuNativeBackend(model, KernelOptions(), chunks, kernels)
    other = copy.deepcopy(model)  # an int8 backend takes over its model's encoder products: one model each
    dot_path = CpuNativeBackend(
        other, KernelOptions(cpu_int8_weights=True), lay_out_for_cpu(other.decoder, True), kernels
    )
    int8_path = CpuNativeBackend(model, KernelOptions(cpu_int8_weights=True, cpu_int8_dot=False), chunks, kernels)
    assert len(int8_path.int8) == 6 * len(dec.blocks) and int8_path.vocab_int8 is not None
    assert all(q.sums is None for q in int8_path.int8.values())
    assert all((q.sums is not None) == kernels.int8_dot for q in dot_path.int8.values())
    shape = CacheShape.for_model(model.dims, None, None)
    with torch.inference_mode():
        features = model.encoder(torch.randn(3, model.dims.n_mels, 3000))
        out = []
        for backend in (float_path, int8_path, dot_path):
            cache = KVCache(shape, 3, torch.float32, torch.device("cpu"))
            dec.fill_cross_cache(features, cache, 0)
            logits = [
                backend.logits(backend.eager_step(torch.tensor([[50257]]), torch.tensor([[0]]), cache, [0], 0)[:, -1])
            ]
            tokens, positions = torch.tensor([[440], [2068], [50362]]), torch.tensor([[1], [0], [0]])
            hidden = backend.eager_step(tokens, positions, cache, positions.flatten().tolist(), 0)
            logits.append(backend.logits(hidden[:, -1]))
            out.append(torch.cat(logits))
    torch.testing.assert_close(out[1], out[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out[2], out[0], rtol=0.05, atol=0.1)


def two_steps(model, backend, features) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's int8 or float32 step and then three rows' through `backend`, over cross caches of `features`: their
    logits (one after the other) and the self-attention cache they leave."""
    cache = KVCache(CacheShape.for_model(model.dims, None, None), 3, torch.float32, torch.device("cpu"))
    model.decoder.fill_cross_cache(features, cache, 0)
    logits = [backend.eager_logits(torch.tensor([[50257]]), torch.tensor([[0]]), cache, [0])]
    tokens, positions = torch.tensor([[440], [2068], [50362]]), torch.tensor([[1], [0], [0]])
    logits.append(backend.eager_logits(tokens, positions, cache, positions.flatten().tolist()))
    return torch.cat(logits), cache.self_kv


@native
@pytest.mark.parametrize("int8", [False, True])
def test_team_size_leaves_every_bit_of_a_step_alone(kernels, int8):
    """cpu_team.py picks one thread or the full team per step: each output column and each (row, head) is one
    thread's work in the same order either way, so one row's steps and several rows' give the same bits."""
    model, _, native_path = tiny_backends(kernels)
    backend = CpuNativeBackend(model, KernelOptions(cpu_int8_weights=int8), native_path.output_chunks, kernels)
    with torch.inference_mode():
        features = model.encoder(torch.randn(3, model.dims.n_mels, 3000))
        runs = []
        for size in (1, 3):  # 3: more threads than this machine may have cores, still one team
            with kernels.team(size):
                assert kernels.threads() == size
                runs.append(two_steps(model, backend, features))
    assert kernels.threads() == torch.get_num_threads()  # the block's size is gone after it
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@native
def test_integer_dot_product_forms_give_the_same_decode_steps(kernels, monkeypatch):
    """One row's int8 steps and several rows' give the same bits with the AVX2 form of the integer dot products as
    with VNNI's: the same weights serve both, and a request's tokens do not depend on the CPU it runs on."""
    if not kernels.vnni:
        pytest.skip("this CPU has no AVX-512 VNNI: the AVX2 form alone runs here")
    model, _, native_path = tiny_backends(kernels)
    backend = CpuNativeBackend(model, KernelOptions(cpu_int8_weights=True), native_path.output_chunks, kernels)
    assert all(q.sums is not None for q in backend.int8.values())
    with torch.inference_mode():
        features = model.encoder(torch.randn(3, model.dims.n_mels, 3000))
        runs = []
        for form in ("vnni", "avx2"):
            monkeypatch.setattr(kernels, "dot_form", form)
            runs.append(two_steps(model, backend, features))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@native
@pytest.mark.parametrize("rows", [1, 2, 5])
@torch.inference_mode()
def test_blocked_weights_give_the_input_major_products_bit_for_bit(kernels, rows):
    """BlockedWeight (each task's columns contiguous) is a layout only: every output sums the same products in the
    same order, with the norm, bias, residual and GELU fused as before, for one row and for several."""
    torch.manual_seed(rows)
    k, n = 384, 1536
    x, w_t, b, r = torch.randn(rows, k), torch.randn(k, n), torch.randn(n), torch.randn(rows, n)
    blocked = BlockedWeight.of(w_t)
    assert blocked.shape == (k, n) and blocked.blocks.shape == (n // cpu_kernels.COLS, k, cpu_kernels.COLS)
    ln = torch.nn.LayerNorm(k)
    torch.nn.init.normal_(ln.weight)
    torch.nn.init.normal_(ln.bias)
    for fused in ({}, {"residual": r}, {"norm": ln, "gelu": True}):
        want = kernels.linear_rows(x, w_t, b, **fused)
        assert torch.equal(kernels.linear_rows(x, blocked, b, **fused), want)
        one = {key: value[:1] if key == "residual" else value for key, value in fused.items()}
        assert torch.equal(kernels.linear(x[:1], blocked, b, **one), kernels.linear(x[:1], w_t, b, **one))


@native
def test_decode_steps_from_blocked_copies_are_bit_for_bit_the_input_major_ones(kernels):
    """The float32 backend keeps blocked copies of the decoder's products (where they fit): one row's steps and
    several rows' give exactly what the input-major weights give."""
    model, _, blocked_path = tiny_backends(kernels)
    assert len(blocked_path.blocked) == 6 * len(model.decoder.blocks)
    plain_path = CpuNativeBackend(model, KernelOptions(), blocked_path.output_chunks, kernels)
    plain_path.blocked = {}
    with torch.inference_mode():
        features = model.encoder(torch.randn(3, model.dims.n_mels, 3000))
        runs = [two_steps(model, backend, features) for backend in (plain_path, blocked_path)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_off_switch():
    model = Whisper(DUMMY_DIMS["tiny"])
    backend = select_backend(model, torch.device("cpu"), torch.float32, False, KernelOptions(cpu_decode=False))
    assert type(backend) is CpuTorchBackend


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
