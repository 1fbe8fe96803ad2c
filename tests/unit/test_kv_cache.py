"""The caches' rows and cross slots: what the scheduler relies on to keep running sequences contiguous and to let
a window's beams share one cross slot."""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.int8_attention import dequantize
from engine.kernels.options import DEFAULT_KERNELS
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache, plan_num_slots
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper, cross_attention, indexed_cross_attention, tiled_positions


def filled_cache(int8_cross: bool, n_audio_ctx: int, rows: int = 12, cross: int | None = None) -> KVCache:
    shape = CacheShape.for_model(DUMMY_DIMS["tiny"], n_audio_ctx, 32)
    cache = KVCache(shape, rows, torch.float32, torch.device("cpu"), int8_cross, cross)
    gen = torch.Generator().manual_seed(0)
    for t in (cache.self_kv, cache.cross_k, cache.cross_v, cache.cross_k_scale, cache.cross_v_scale):
        if t is not None:
            values = torch.randint(-100, 100, t.shape, generator=gen).to(t.dtype)
            t.copy_(values)
    return cache


def cross_tensors(cache: KVCache) -> list[torch.Tensor]:
    return [t for t in (cache.cross_k, cache.cross_v, cache.cross_k_scale, cache.cross_v_scale) if t is not None]


@pytest.mark.parametrize("int8_cross", [False, True])
@pytest.mark.parametrize("n_audio_ctx", [1500, 1501])  # 1501: rows that no wider integer tiles
def test_moves_copy_each_rows_self_cache_and_leave_the_cross_cache(int8_cross, n_audio_ctx):
    cache = filled_cache(int8_cross, n_audio_ctx)
    before = filled_cache(int8_cross, n_audio_ctx)
    # a run of three (9, 10, 11 -> 0, 1, 2), a lone move (7 -> 4) and differing prefix lengths within the run
    moves = [(9, 0, 5), (10, 1, 9), (11, 2, 3), (7, 4, 6)]
    cache.move_slots(moves)
    for src, dst, self_len in moves:
        assert torch.equal(cache.self_kv[:, :, dst, :, :self_len], before.self_kv[:, :, src, :, :self_len])
    untouched = set(range(12)) - {dst for _, dst, _ in moves}
    for slot in untouched:
        assert torch.equal(cache.self_kv[:, :, slot], before.self_kv[:, :, slot])
    for got, want in zip(cross_tensors(cache), cross_tensors(before)):
        assert torch.equal(got, want)  # a row finds its window's cross slot through row_cross: nothing moves


def test_cross_runs_cover_the_rows_in_slices_of_the_cache():
    cache = filled_cache(False, 1500, rows=10, cross=6)
    assert cache.cross_runs(0, 6) == [(0, 6, 0, False, 1500)]  # the initial map: row r reads slot r
    cache.map_rows(0, [3, 4, 1, 1, 1, 5, 0, 2, 2])
    assert cache.cross_runs(0, 9) == [(0, 2, 3, False, 1500), (2, 5, 1, True, 1500), (5, 6, 5, False, 1500),
                                      (6, 7, 0, False, 1500), (7, 9, 2, True, 1500)]  # fmt: skip
    assert cache.cross_runs(2, 3) == [(0, 3, 1, True, 1500)]
    # a slot filled on a short context ends a run: its rows read fewer positions
    cache.set_cross_len(4, 150)
    assert cache.cross_runs(0, 3) == [(0, 1, 3, False, 1500), (1, 2, 4, False, 150), (2, 3, 1, False, 1500)]
    assert cache.row_cross[:9] == [3, 4, 1, 1, 1, 5, 0, 2, 2]
    assert cache.cross_index[:9].tolist() == [3, 4, 1, 1, 1, 5, 0, 2, 2]
    # rows reading one slot side by side, then the rows past the mapped ones in order: a permutation of all rows
    order = cache.cross_order.tolist()
    assert sorted(order) == list(range(10)) and order[9:] == [9]
    assert [cache.row_cross[r] for r in order[:9]] == sorted(cache.row_cross[:9])


@pytest.mark.parametrize("int8_cross", [False, True])
def test_cross_attention_reads_each_rows_window(int8_cross):
    """Rows mapped to cross slots in any layout (consecutive, shared by a beam search's rows, out of order) attend
    exactly as if each row's slot were laid out beside it."""
    cache = filled_cache(int8_cross, 1500, rows=8, cross=5)
    if not int8_cross:  # values of the size real keys have, so the softmax is not one-hot
        cache.cross_k.div_(100)
        cache.cross_v.div_(100)
    cache.map_rows(0, [2, 3, 0, 0, 0, 4, 1])
    shape = cache.shape
    q = torch.randn(7, shape.n_head, 3, shape.head_dim, generator=torch.Generator().manual_seed(1))
    got = cross_attention(q, cache, 1, 0, DEFAULT_KERNELS)
    for row, slot in enumerate(cache.row_cross[:7]):
        k, v, ks, vs = cache.cross_layer(1, slice(slot, slot + 1))
        if ks is not None:
            k, v = k.float() * ks.float()[..., None], v.float() * vs.float()[..., None]
        want = F.scaled_dot_product_attention(q[row : row + 1], k, v)
        torch.testing.assert_close(got[row : row + 1], want, rtol=1e-5, atol=1e-5)


def test_rows_asked_for_beyond_the_memory_of_pairs_keep_their_count_and_share_fewer_cross_slots():
    shape = CacheShape.for_model(DUMMY_DIMS["tiny"], None, None)
    cpu = torch.device("cpu")
    rows, cross, _ = plan_num_slots(shape, torch.float32, cpu, 0.9, 0, max_rows=32)
    assert rows == cross == 32
    per_row, per_cross = shape.self_bytes(torch.float32), shape.cross_bytes(torch.float32)
    pairs = 4 * 1024**3 // (per_row + per_cross)
    rows, cross, _ = plan_num_slots(shape, torch.float32, cpu, 0.9, 0, max_rows=pairs + 100)
    assert (rows, cross) == (pairs, pairs)  # the default cap: rows and cross slots in pairs
    rows, cross, _ = plan_num_slots(shape, torch.float32, cpu, 0.9, 0, max_rows=pairs + 100, rows_asked=True)
    assert rows == pairs + 100 and cross == (4 * 1024**3 - rows * per_row) // per_cross < pairs


def test_cross_attention_reads_a_short_contexts_filled_positions_only():
    """A window encoded on a short context fills its slot's first positions; what lies past them (an earlier
    window's) is never read, and rows beside it in the same step read their own full slots."""
    cache = filled_cache(False, 1500, rows=4, cross=4)
    cache.cross_k.div_(100)
    cache.cross_v.div_(100)
    cache.set_cross_len(1, 150)
    q = torch.randn(4, cache.shape.n_head, 1, cache.shape.head_dim, generator=torch.Generator().manual_seed(2))
    got = cross_attention(q, cache, 0, 0, DEFAULT_KERNELS)
    for row, positions in enumerate((1500, 150, 1500, 1500)):
        k, v, _, _ = cache.cross_layer(0, slice(row, row + 1))
        want = F.scaled_dot_product_attention(q[row : row + 1], k[:, :, :positions], v[:, :, :positions])
        torch.testing.assert_close(got[row : row + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("int8_cross", [False, True])
def test_a_short_context_tiled_across_its_slot_attends_as_its_positions_once(int8_cross):
    """Where the kernels read whole cross slots (the GPU's indexed_cross_attention), a short context's positions
    copied end to end across its slot weigh each key as the positions once: the softmax's sums scale together."""
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    decoder = model.eval().requires_grad_(False).decoder
    cache = filled_cache(int8_cross, dims.n_audio_ctx, rows=3, cross=3)  # an earlier window's keys everywhere
    assert [tiled_positions(n, 1500) for n in (1, 240, 250, 251, 376, 751, 1500)] == [1, 250, 250, 300, 500, 1500, 1500]
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(2, 250, dims.n_audio_state, generator=gen)
    with torch.inference_mode():
        decoder.fill_cross_cache(features, cache, [2, 0], tile=True)
        q = torch.randn(3, dims.n_text_head, 1, cache.shape.head_dim, generator=gen)
        cache.map_rows(0, [2, 0, 1])  # rows 0 and 1 read the tiled slots, row 2 a full one
        got = indexed_cross_attention(q, cache, 1, 0, DEFAULT_KERNELS)
    assert cache.cross_len[:3] == [250, 1500, 250]
    for row, slot in enumerate((2, 0, 1)):
        k, v, k_scale, v_scale = cache.cross_layer(1, slice(slot, slot + 1))
        if int8_cross:
            k, v = dequantize(k, k_scale, q.dtype), dequantize(v, v_scale, q.dtype)
        if slot != 1:  # six copies of the first 250 positions
            assert torch.equal(k, k[:, :, :250].repeat(1, 1, 6, 1)) and torch.equal(v, v[:, :, :250].repeat(1, 1, 6, 1))
        positions = cache.cross_len[slot]
        want = F.scaled_dot_product_attention(q[row : row + 1], k[:, :, :positions], v[:, :, :positions])
        torch.testing.assert_close(got[row : row + 1], want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="tile"):
        decoder.fill_cross_cache(features[:, :240], cache, [2, 0], tile=True)


@pytest.mark.parametrize("int8_cross", [False, True])
def test_windows_given_out_of_their_slots_order_fill_each_its_own_slot_in_one_run(int8_cross, monkeypatch):
    """The encoder may hand windows over in another order than their cross slots' (by adapter): each slot holds its
    own window's keys and values, as filled one window at a time, and consecutive slots are written together."""
    from engine.model import whisper

    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    decoder = model.eval().requires_grad_(False).decoder
    features = torch.randn(4, dims.n_audio_ctx, dims.n_audio_state, generator=torch.Generator().manual_seed(4))
    runs = []
    consecutive = whisper._consecutive
    monkeypatch.setattr(whisper, "_consecutive", lambda slots: runs.append(consecutive(slots)) or runs[-1])
    together, alone = (filled_cache(int8_cross, dims.n_audio_ctx, rows=4, cross=4) for _ in range(2))
    with torch.inference_mode():
        decoder.fill_cross_cache(features, together, [3, 1, 2, 0])
        assert runs == [[(0, 4, 0)]] * dims.n_text_layer  # each layer: one run of slots 0-3
        for window, slot in enumerate([3, 1, 2, 0]):
            decoder.fill_cross_cache(features[window : window + 1], alone, [slot])
    for got, want in zip(cross_tensors(together), cross_tensors(alone)):
        assert torch.equal(got, want)
