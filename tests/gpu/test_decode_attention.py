"""The decode step's self-attention kernel (engine/kernels/decode_attention.py) against torch's write + SDPA."""

import pytest
import torch
import torch.nn.functional as F

from engine.backends import select_backend
from engine.kernels import decode_attention
from engine.kernels.options import KernelOptions
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.model.whisper import Whisper


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5, 256])
def test_kernel_writes_and_attends_like_torch(cuda, dtype, rows):
    assert decode_attention.triton is not None
    gen = torch.Generator(cuda).manual_seed(rows)
    slots, heads, ctx, dim, start = rows + 3, 20, 448, 64, 2
    k_cache, v_cache = (torch.randn(slots, heads, ctx, dim, device=cuda, generator=gen).to(dtype) for _ in "kv")
    qkv = torch.randn(rows, 1, 3 * heads * dim, device=cuda, generator=gen).to(dtype) * 2
    host = torch.stack([torch.zeros(rows, dtype=torch.long), torch.randint(0, ctx, (rows,))], dim=1)
    host[0, 1] = 0
    host[-1, 1] = ctx - 1
    positions = host.to(cuda)[:, 1:]  # a strided view, as the eager step passes it

    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    q, k_new, v_new = qkv.view(rows, 3, heads, dim).unbind(1)
    row_slots = torch.arange(start, start + rows, device=cuda)
    ref_k[row_slots, :, positions[:, 0]] = k_new
    ref_v[row_slots, :, positions[:, 0]] = v_new
    allowed = (torch.arange(ctx, device=cuda) <= positions[:, :, None])[:, None]  # (rows, 1, 1, ctx)
    ref = F.scaled_dot_product_attention(
        q[:, :, None].double(), ref_k[row_slots].double(), ref_v[row_slots].double(), attn_mask=allowed
    ).reshape(rows, 1, heads * dim)

    out = decode_attention.self_attention_step(qkv, k_cache, v_cache, positions, start)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)  # the new K/V, and nothing else
    err = (out.double() - ref).abs().max().item()
    assert err < (4e-3 if dtype == torch.float16 else 1e-5) * ref.abs().max().item(), err


@pytest.mark.parametrize("position", [0, 1, 31, 127, 128, 129, 300, 447])
def test_lone_row_reads_its_first_positions_before_waiting(cuda, position):
    """A lone row (launched as a dependent on Hopper and later) holds the first LONE_ROW_PREFETCH positions read
    before the q/k/v product finished; at every position around that bound it attends over exactly its prefix."""
    gen = torch.Generator(cuda).manual_seed(position)
    heads, ctx, dim = 20, 448, 64
    k_cache, v_cache = (torch.randn(3, heads, ctx, dim, device=cuda, generator=gen).half() for _ in "kv")
    qkv = torch.randn(1, 1, 3 * heads * dim, device=cuda, generator=gen).half() * 2
    positions = torch.tensor([[position]], device=cuda)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    q, k_new, v_new = qkv.view(3, heads, dim).unbind(0)
    ref_k[1, :, position], ref_v[1, :, position] = k_new, v_new  # slot 1: slot_start 1, row 0
    n = position + 1
    ref = F.scaled_dot_product_attention(q[:, None].double(), ref_k[1, :, :n].double(), ref_v[1, :, :n].double())

    out = decode_attention.self_attention_step(qkv, k_cache, v_cache, positions, 1)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)  # the new K/V, and nothing else
    err = (out.double().view(heads, 1, dim) - ref).abs().max().item()
    assert err < 4e-3 * ref.abs().max().item(), err


def test_decoder_step_same_with_and_without_the_kernel(cuda):
    """The GPU backend's step (the kernel) against the model as written (indexed write, masked SDPA)."""
    dims = DUMMY_DIMS["tiny"]
    torch.manual_seed(0)
    model = Whisper(dims)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.05)
    model = model.to(cuda, torch.float16).eval()
    backend = select_backend(model, cuda, torch.float16, False, KernelOptions())
    assert backend.reads_own_prefix
    results = []
    for kernel in (True, False):
        cache = KVCache(CacheShape.for_model(dims, None, None), 6, torch.float16, cuda)
        gen = torch.Generator(cuda).manual_seed(1)
        with torch.inference_mode():
            feats = torch.randn(6, dims.n_audio_ctx, dims.n_audio_state, device=cuda, generator=gen).half()
            model.decoder.fill_cross_cache(feats, cache, 0)
            outs = []
            for step in range(5):  # rows 1..4 (slots 1..4) at staggered positions, up to one bucket
                tokens = torch.randint(0, 50000, (4, 1), device=cuda, generator=gen)
                positions = torch.tensor([[step], [step + 3], [step + 10], [step + 60]], device=cuda)
                kv_len = 128
                if kernel:
                    outs.append(backend.decode_step(tokens, positions, cache, kv_len, 1))
                else:
                    mask = (torch.arange(kv_len, device=cuda) <= positions[:, :, None])[:, None]
                    outs.append(model.decoder(tokens, positions, cache, 1, kv_len, mask))
        results.append((torch.stack(outs).float(), cache.self_kv.clone()))
    (with_kernel, kv_kernel), (without, kv_torch) = results
    # layer 0 writes the same K/V; later layers' differ by the rounding of the attention before them
    assert torch.equal(kv_kernel[0], kv_torch[0])
    assert (kv_kernel.float() - kv_torch.float()).abs().max().item() < 2e-2 * kv_torch.float().abs().max().item()
    assert (with_kernel - without).abs().max().item() < 2e-2 * without.abs().max().item()
