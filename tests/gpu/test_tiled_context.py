"""Short contexts on the GPU backends, whose kernels read whole cross slots: copies of a short context's positions
fill its slot (TextDecoder.fill_cross_cache `tile`), and every cross-attention kernel then attends as if to the
positions once; an engine decodes a partial's short context as the same context read directly (on the CPU)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine.audio.constants import SAMPLE_RATE
from engine.config import EngineConfig
from engine.kernels.int8_attention import dequantize
from engine.kernels.options import KernelOptions
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper, indexed_cross_attention
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.transcripts import normalize_text


@pytest.mark.parametrize("int8_cross", [True, False])
@pytest.mark.parametrize("kernel", ["cuda", "triton"])
@pytest.mark.parametrize("rows", [1, 5])  # a lone row's kernel, and the rows'
def test_every_kernel_attends_to_a_tiled_slot_as_to_its_positions_once(cuda, int8_cross, kernel, rows):
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    decoder = model.to(cuda, torch.float16).eval().requires_grad_(False).decoder
    cache = KVCache(CacheShape.for_model(dims, None, None), rows + 1, torch.float16, cuda, int8_cross, rows + 1)
    gen = torch.Generator(cuda).manual_seed(rows)
    for t in (cache.cross_k, cache.cross_v):  # an earlier window's keys everywhere
        t.copy_(torch.randint(-100, 100, t.shape, device=cuda, generator=gen).to(t.dtype))
    features = torch.randn(rows, 300, dims.n_audio_state, device=cuda, generator=gen, dtype=torch.float16)
    with torch.inference_mode():
        decoder.fill_cross_cache(features, cache, list(range(rows)), tile=True)
        cache.map_rows(0, list(range(rows)))
        q = torch.randn(
            rows, dims.n_text_head, 1, cache.shape.head_dim, device=cuda, generator=gen, dtype=torch.float16
        )
        kernels = KernelOptions(int8_attention=kernel, int8_lone_row=True)
        got = indexed_cross_attention(q, cache, 2, 0, kernels).float()
    k, v, k_scale, v_scale = cache.cross_layer(2, slice(0, rows))
    k, v = k[:, :, :300].float(), v[:, :, :300].float()
    if int8_cross:
        k, v = dequantize(k, k_scale[:, :, :300], torch.float32), dequantize(v, v_scale[:, :, :300], torch.float32)
    want = F.scaled_dot_product_attention(q.float(), k, v)
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


def test_an_engine_decodes_a_short_context_as_the_cpu_reads_it(cuda, gpu_model, read_wav):
    """4 s of speech and a 3 s margin (350 positions, tiled as 375): on the GPU the same words as the CPU engine,
    which reads 375 positions (a 3.5 s margin) directly."""
    from tests.helpers.data import DATA

    audio = read_wav(DATA / "g1_en_librispeech-test-clean_1221-135766-0001.wav")[: 4 * SAMPLE_RATE]
    short = DecodeOptions(temperatures=(0.0,), context_margin_s=3.0, without_timestamps=True)
    texts = []
    for device, options in (("cuda", short), ("cpu", dataclasses.replace(short, context_margin_s=3.5))):
        engine = Engine(EngineConfig(model=gpu_model, device=device, max_num_seqs=4))
        engine.start()
        try:
            texts.append(engine.submit(audio, options).wait(timeout=120).text)
            assert device == "cpu" or (engine.runner.tiles_short_contexts and engine.runner.cache.cross_len[0] == 375)
        finally:
            engine.shutdown()
    # float16 on the GPU, the CPU's own precision there: the same words, case and punctuation aside
    assert texts[0] and normalize_text(texts[0]) == normalize_text(texts[1]), texts


def test_short_contexts_replay_encoder_graphs_that_give_the_eager_passes_features(cuda, gpu_model):
    """Every tiled length has encoder graphs of a few windows: a pass of 1, 8, 3 (padded to 4) and 11 windows (a
    piece of 8, then 3) replays them and gives the features of the same pass run eagerly: bit for bit at a captured
    size; padded, the products' row count differs, which may change their tiling, so up to float16 rounding."""
    from engine.runtime.model_runner import ModelRunner

    runner = ModelRunner(EngineConfig(model=gpu_model, device="cuda", max_num_seqs=16, short_context_graphs=True))
    graphs, dims = runner.graphs, runner.model.dims
    assert runner.tiles_short_contexts and graphs is not None
    lengths = sorted({frames for _, frames in graphs.short_encoder_graphs})
    assert lengths == [2 * n for n in range(250, 1500) if 1500 % n == 0], lengths
    gen = torch.Generator(cuda).manual_seed(0)
    for frames in (lengths[0], lengths[-1]):
        for n in (1, 8, 3, 11):
            mels = torch.randn(n, dims.n_mels, frames, device=cuda, generator=gen).to(runner.dtype)
            replays = graphs.stats.encoder_replays
            with torch.inference_mode():
                replayed = graphs.encode(mels).clone()
                eager = runner.backend.encode(mels)
            assert graphs.stats.encoder_replays == replays + (2 if n > 8 else 1), (frames, n)
            assert replayed.shape == (n, frames // 2, dims.n_audio_state)
            if n in (1, 8):
                assert torch.equal(replayed, eager), (frames, n)
            else:
                torch.testing.assert_close(replayed, eager, rtol=1e-2, atol=1e-2)
