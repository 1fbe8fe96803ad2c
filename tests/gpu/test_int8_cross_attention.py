"""The int8 cross-attention kernels (CUDA and Triton) equal their reference (dequantize, then SDPA), in graphs and
out, and an engine with an int8 cross cache transcribes real speech as the float16 one does."""

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.kernels import int8_attention
from engine.kernels.int8_attention import dequantize, quantize
from engine.kernels.int8_attention import int8_attention as attention
from engine.kernels.options import KernelOptions
from engine.request import DecodeOptions
from engine.runtime.engine import Engine


@pytest.mark.parametrize("kernel", ["cuda", "triton"])
@pytest.mark.parametrize(
    "rows,heads,queries,dtype",
    [(1, 20, 1, "float16"), (7, 6, 1, "float16"), (40, 20, 1, "float16"), (256, 20, 1, "float16"),
     (3, 20, 5, "float16"), (5, 20, 1, "bfloat16"), (64, 20, 1, "bfloat16")],
)  # fmt: skip
def test_kernel_matches_dequantized_sdpa(cuda, monkeypatch, kernel, rows, heads, queries, dtype):
    assert int8_attention.triton is not None, "Triton is needed on a GPU"
    kernels = KernelOptions(int8_attention=kernel, int8_lone_row=False)  # a lone row takes the kernel under test too
    dtype = getattr(torch, dtype)
    gen = torch.Generator(cuda).manual_seed(rows)
    slots, n, dim = rows + 3, 1500, 64
    # k, v are slices of a per-slot cache of 2 layers, as in a decoder step (layer 1, slots 0..rows)
    k_cache, v_cache = (torch.randn(2, slots, heads, n, dim, device=cuda, generator=gen) * 4 for _ in "kv")
    (kq, ks), (vq, vs) = quantize(k_cache), quantize(v_cache)
    q = torch.randn(rows, heads, queries, dim, device=cuda, generator=gen, dtype=dtype) * 3
    args = (kq[1, :rows], ks[1, :rows], vq[1, :rows], vs[1, :rows])
    if kernel == "cuda":  # the CUDA kernel must really run here (NVRTC ships with torch's CUDA builds)
        assert int8_attention._cuda_kernel(q) is not None and int8_attention._cuda_layout_fits(q, *args)
    out = attention(q, *args, kernels).float()
    ref = F.scaled_dot_product_attention(
        q.float(), dequantize(kq[1, :rows], ks[1, :rows], torch.float32), dequantize(vq[1, :rows], vs[1, :rows], torch.float32)
    )
    tolerance = 2e-3 if dtype == torch.float16 else 8e-3  # the output's rounding: 11 or 8 significant bits
    assert (out - ref).abs().max().item() < tolerance * ref.abs().max().item()


@pytest.mark.parametrize("n", [1500, 37, 4100])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lone_row_kernel_matches_dequantized_sdpa(cuda, n, dtype):
    """A lone query row per head (a single sequence's step) on Hopper and later: the kernel that reads its split's
    keys before waiting for the query, at Whisper's 1,500 keys, with splits left empty (37 keys: 3 per split) and
    at the most keys a split holds in registers (4,100: 257 per split, so the kernels above serve instead)."""
    if torch.cuda.get_device_capability(cuda)[0] < 9:
        pytest.skip("dependent launches need Hopper or later")
    dtype = getattr(torch, dtype)
    gen = torch.Generator(cuda).manual_seed(n)
    k_cache, v_cache = (torch.randn(2, 3, 20, n, 64, device=cuda, generator=gen) * 4 for _ in "kv")
    (kq, ks), (vq, vs) = quantize(k_cache), quantize(v_cache)
    args = (kq[1, 2:], ks[1, 2:], vq[1, 2:], vs[1, 2:])  # the last slot of layer 1's cache, as a decoder step reads
    q = (torch.randn(1, 1, 20, 64, device=cuda, generator=gen, dtype=dtype) * 3).transpose(1, 2)  # strided heads
    assert int8_attention._lone_row_applies(q, args[0], pdl=True) == (n <= 16 * 256)
    out = attention(q, *args).float()
    ref = F.scaled_dot_product_attention(
        q.float(), dequantize(args[0], args[1], torch.float32), dequantize(args[2], args[3], torch.float32)
    )
    tolerance = 2e-3 if dtype == torch.float16 else 8e-3
    assert (out - ref).abs().max().item() < tolerance * ref.abs().max().item()


@pytest.mark.parametrize("path", ["cuda", "triton", "lone", "float16", "invariant"])
@pytest.mark.parametrize("ordered", [False, True])
def test_indexed_kernels_read_each_rows_slot(cuda, path, ordered):
    """Rows reading cache slots through an index (a beam search's rows share one; the others any free slot), walked
    in the order that puts one slot's rows side by side: each row equals its slot's reference. Every kernel that
    reads the cross cache: CUDA, Triton, the lone row's (one row), the float16 cache's, the batch-invariant one's."""
    gen = torch.Generator(cuda).manual_seed(9)
    slots, heads, n, dim = 9, 20, 1500, 64
    k_cache, v_cache = (torch.randn(slots, heads, n, dim, device=cuda, generator=gen) * 4 for _ in "kv")
    (kq, ks), (vq, vs) = quantize(k_cache), quantize(v_cache)
    cross = [1, 1, 1, 1, 1, 7, 0, 4, 4, 4, 2] if path != "lone" else [6]
    if path == "lone" and torch.cuda.get_device_capability(cuda)[0] < 9:
        pytest.skip("dependent launches need Hopper or later")
    index = torch.tensor(cross, dtype=torch.int32, device=cuda)
    order = None
    if ordered:
        order = torch.tensor(sorted(range(len(cross)), key=cross.__getitem__), dtype=torch.int32, device=cuda)
    q = torch.randn(len(cross), heads, 1, dim, device=cuda, generator=gen, dtype=torch.float16) * 3
    kernels = KernelOptions(int8_attention="triton" if path == "triton" else "cuda")
    if path == "float16":
        k16, v16 = k_cache.half(), v_cache.half()
        out = int8_attention.indexed_attention(q, k16, None, v16, None, index, order, kernels)
        refs = [(k16[c : c + 1].float(), v16[c : c + 1].float()) for c in cross]
    else:
        if path == "invariant":
            out = int8_attention.fixed_split_attention(q, kq, vq, ks, vs, kernels, index, order)
        else:
            out = int8_attention.indexed_attention(q, kq, ks, vq, vs, index, order, kernels)
        refs = [(dequantize(kq[c : c + 1], ks[c : c + 1], torch.float32),
                 dequantize(vq[c : c + 1], vs[c : c + 1], torch.float32)) for c in cross]  # fmt: skip
    for row, (k, v) in enumerate(refs):
        ref = F.scaled_dot_product_attention(q[row : row + 1].float(), k, v)
        assert (out[row : row + 1].float() - ref).abs().max().item() < 2e-3 * ref.abs().max().item(), row


def test_misaligned_cache_views_fall_back_to_triton(cuda):
    """A view whose vectors do not start on 16 bytes cannot take the CUDA kernel's loads: the Triton kernel serves."""
    gen = torch.Generator(cuda).manual_seed(5)
    k, v = (torch.randn(4, 20, 1500, 64, device=cuda, generator=gen) for _ in "kv")
    (kq, ks), (vq, vs) = quantize(k), quantize(v)
    shifted = torch.empty(kq.numel() + 8, dtype=torch.int8, device=cuda)[8:].view(kq.shape)
    shifted.copy_(kq)
    q = torch.randn(4, 20, 1, 64, device=cuda, generator=gen, dtype=torch.float16)
    assert not int8_attention._cuda_layout_fits(q, shifted, ks, vq, vs)
    assert torch.allclose(attention(q, shifted, ks, vq, vs), attention(q, kq, ks, vq, vs), atol=2e-3)


@pytest.fixture(scope="module")
def engines(cuda, gpu_model):
    made = [Engine(EngineConfig(model=gpu_model, device="cuda", max_num_seqs=64, cross_cache_dtype=c)) for c in ("model", "int8")]
    for e in made:
        e.start()
    yield made
    for e in made:
        e.shutdown()


def test_int8_graph_decode_matches_eager(engines):
    runner = engines[1].runner
    graphs, model, cache, backend = runner.graphs, runner.model, runner.cache, runner.backend
    assert cache.cross_k.dtype == torch.int8
    gen = torch.Generator(runner.device).manual_seed(0)
    with torch.inference_mode():
        feats = torch.randn(cache.num_slots, runner.dims.n_audio_ctx, runner.dims.n_audio_state,
                            device=runner.device, generator=gen).to(runner.dtype)  # fmt: skip
        model.decoder.fill_cross_cache(feats, cache, 0)
        kv = graphs.kv_sizes[0]
        for bs in graphs.decode_sizes:
            tokens = torch.randint(0, 50000, (bs, 1), device=runner.device, generator=gen)
            positions = torch.randint(0, kv, (bs, 1), device=runner.device, generator=gen)
            replayed = graphs.decode(tokens, positions, kv).clone()
            eager = backend.logits(backend.decode_step(tokens, positions, cache, kv)[:, -1])
            assert torch.equal(replayed.argmax(-1), eager.argmax(-1)), bs
            assert (replayed - eager).abs().max().item() < 1e-2 * eager.abs().max().item(), bs


def test_int8_cross_cache_gives_the_float16_tokens(engines, gpu_clips, read_wav):
    audios = [read_wav(p) for p in gpu_clips]
    options = DecodeOptions(temperatures=(0.0,))

    def run(engine):
        handles = [engine.submit(a, options) for a in audios]  # all at once: batched steps, slots moved
        return [[s.tokens for s in h.wait(timeout=300).segments] for h in handles]

    fp16, int8 = run(engines[0]), run(engines[1])
    same = [p.name for p, a, b in zip(gpu_clips, fp16, int8) if a == b]
    print(f"\nint8 cross cache: {len(same)} of {len(audios)} clips token-identical to float16")
    # The int8 cache is an approximation: where two timestamps are near a tie at a pause, either may win (seen on
    # one LibriSpeech clip, 0.12 s apart, with the same text). Text tokens must agree everywhere; a timestamp may
    # move by at most 0.2 s, in at most one clip.
    ts_begin = engines[0].tokenizer.timestamp_begin
    for p, a, b in zip(gpu_clips, fp16, int8):
        assert [len(s) for s in a] == [len(s) for s in b], p.name
        for x, y in zip((t for s in a for t in s), (t for s in b for t in s)):
            assert x == y or (min(x, y) >= ts_begin and abs(x - y) <= 10), (p.name, x, y)
    assert len(same) >= len(audios) - 1, sorted({p.name for p in gpu_clips} - set(same))
    jfk = next(p for p in gpu_clips if "jfk" in p.name)
    assert "ask not what your country can do for you" in engines[1].transcribe(read_wav(jfk)).text.lower()


def test_quantize_kernel_matches_torch(cuda):
    gen = torch.Generator(cuda).manual_seed(3)
    # keys as the decoder projects them: (windows, heads, positions, dim) viewed out of (windows, positions, state)
    x = torch.randn(4, 1500, 20 * 64, device=cuda, generator=gen, dtype=torch.float16).view(4, 1500, 20, 64).transpose(1, 2)
    values = torch.zeros(6, 20, 1500, 64, dtype=torch.int8, device=cuda)
    scale = torch.zeros(6, 20, 1500, dtype=int8_attention.SCALE_DTYPE, device=cuda)
    int8_attention.quantize_into(x, values[1:5], scale[1:5])
    ref_values, ref_scale = quantize(x)
    assert torch.equal(scale[1:5], ref_scale)
    assert torch.equal(values[1:5], ref_values)
    assert values[0].abs().sum().item() == 0 and values[5].abs().sum().item() == 0  # other slots untouched
