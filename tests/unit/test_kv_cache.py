"""Slot moves: what the scheduler relies on to keep running sequences contiguous."""

import pytest
import torch

from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache


def filled_cache(int8_cross: bool, n_audio_ctx: int) -> KVCache:
    shape = CacheShape.for_model(DUMMY_DIMS["tiny"], n_audio_ctx, 32)
    cache = KVCache(shape, 12, torch.float32, torch.device("cpu"), int8_cross)
    gen = torch.Generator().manual_seed(0)
    for t in (cache.self_kv, cache.cross_k, cache.cross_v, cache.cross_k_scale, cache.cross_v_scale):
        if t is not None:
            values = torch.randint(-100, 100, t.shape, generator=gen).to(t.dtype)
            t.copy_(values)
    return cache


def slot_views(cache: KVCache, slot: int, self_len: int) -> list[torch.Tensor]:
    views = [cache.self_kv[:, :, slot, :, :self_len], cache.cross_k[:, slot], cache.cross_v[:, slot]]
    if cache.int8_cross:
        views += [cache.cross_k_scale[:, slot], cache.cross_v_scale[:, slot]]
    return views


@pytest.mark.parametrize("int8_cross", [False, True])
@pytest.mark.parametrize("n_audio_ctx", [1500, 1501])  # 1501: rows that no wider integer tiles
def test_moves_copy_each_slot_and_nothing_else(int8_cross, n_audio_ctx):
    cache = filled_cache(int8_cross, n_audio_ctx)
    before = filled_cache(int8_cross, n_audio_ctx)
    # a run of three (9, 10, 11 -> 0, 1, 2), a lone move (7 -> 4) and differing prefix lengths within the run
    moves = [(9, 0, 5), (10, 1, 9), (11, 2, 3), (7, 4, 6)]
    cache.move_slots(moves)
    for src, dst, self_len in moves:
        for got, want in zip(slot_views(cache, dst, self_len), slot_views(before, src, self_len)):
            assert torch.equal(got, want)
    untouched = set(range(12)) - {dst for _, dst, _ in moves}
    for slot in untouched:
        for got, want in zip(slot_views(cache, slot, 32), slot_views(before, slot, 32)):
            assert torch.equal(got, want)
