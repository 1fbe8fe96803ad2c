"""The GPU backend's unfused self-attention (used from UNFUSED_SELF_ATTENTION_ROWS rows on a GPU) equals SDPA."""

import torch
import torch.nn.functional as F

from engine.backends.gpu import UNFUSED_SELF_ATTENTION_ROWS, decode_self_attention
from engine.model.whisper import NEG_INF


def test_unfused_self_attention_matches_sdpa(cuda):
    gen = torch.Generator(cuda).manual_seed(0)
    rows, heads, ctx, dim, kv_len = 256, 20, 448, 64, 128
    assert rows >= UNFUSED_SELF_ATTENTION_ROWS
    # k and v are slices of a per-slot cache, as in a decoder step
    k_cache, v_cache = (torch.randn(rows, heads, ctx, dim, device=cuda, generator=gen, dtype=torch.float16) for _ in "kv")
    k, v = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]
    q = torch.randn(rows, heads, 1, dim, device=cuda, generator=gen, dtype=torch.float16)
    positions = torch.randint(0, kv_len, (rows, 1), device=cuda, generator=gen)
    allowed = (torch.arange(kv_len, device=cuda) <= positions[:, :, None])[:, None]
    mask = torch.zeros(allowed.shape, dtype=torch.float16, device=cuda).masked_fill_(~allowed, NEG_INF)
    out = decode_self_attention(q, k, v, mask).float()
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    assert (out - ref).abs().max().item() < 1e-2 * ref.abs().max().item()
