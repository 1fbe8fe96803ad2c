"""CPU weight layouts for decode: same numbers as the plain model, any batch; heap settings take on glibc."""

import platform

import pytest
import torch

from engine.backends.cpu import CpuTorchBackend, lay_out_for_cpu
from engine.backends.cpu_memory import keep_freed_memory
from engine.kernels.options import KernelOptions
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper


def _model(dims) -> Whisper:
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("size", ["tiny", "base"])  # 51,865-token vocabulary: not a multiple of the chunks
def test_cpu_layout_matches_plain_model(size):
    dims = DUMMY_DIMS[size]
    plain, laid_out = _model(dims), _model(dims)
    plain.decoder.fuse_qkv()
    laid_out.decoder.fuse_qkv(input_major=True)
    backend = CpuTorchBackend(laid_out, KernelOptions(), lay_out_for_cpu(laid_out.decoder, native=False))
    shape = CacheShape.for_model(dims, None, None)
    caches = [KVCache(shape, 4, torch.float32, torch.device("cpu")) for _ in range(2)]
    mel = torch.randn(4, dims.n_mels, 3000)
    with torch.inference_mode():
        features = plain.encoder(mel)
        for model, cache in zip((plain, laid_out), caches):
            model.decoder.fill_cross_cache(features, cache, 0)
        for batch in (1, 3):
            tokens = torch.randint(0, 50000, (batch, 5))
            positions = torch.arange(5).expand(batch, 5)
            mask = (positions[:, None, :, None] >= positions[:, None, None, :])
            out = [plain.decoder.logits(plain.decoder(tokens, positions, caches[0], 0, 5, mask))]
            out.append(backend.logits(backend.prompt_pass(tokens, caches[1], 0)))
            assert out[1].shape == (batch, 5, dims.n_vocab)
            torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)
            # one row at a time takes the chunked vocabulary product; several rows the other layout
            for rows in (out[0][:1, -1], out[0][:, -1]):
                hidden = [m.decoder(tokens[: len(rows)], positions[: len(rows)], c, 0, 5, mask[: len(rows)])[:, -1]
                          for m, c in zip((plain, laid_out), caches)]
                torch.testing.assert_close(backend.logits(hidden[1]), plain.decoder.logits(hidden[0]), rtol=1e-4, atol=1e-4)
        # a one-token step at one shared position writes the cache by slice and attends without a mask
        step = torch.full((3, 1), 7)
        at = torch.full((3, 1), 5)
        full = torch.ones(3, 1, 1, 6, dtype=torch.bool)
        a = plain.decoder(step, at, caches[0], 0, 6, full)
        b = backend.eager_step(step, at, caches[1], [5, 5, 5])
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(caches[1].self_k, caches[0].self_k, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_heap_settings_accepted_by_glibc():
    assert keep_freed_memory() is True


def test_a_masked_step_attends_within_a_shortened_self_cache():
    # rows at different positions take the masked step; its bucket of positions must stop at the cache's length
    # (--max-text-ctx below the decoder's 448), not at the model's
    dims = DUMMY_DIMS["tiny"]
    model = _model(dims)
    model.decoder.fuse_qkv(input_major=True)
    backend = CpuTorchBackend(model, KernelOptions(), lay_out_for_cpu(model.decoder, native=False))
    cache = KVCache(CacheShape.for_model(dims, None, 224), 2, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        model.decoder.fill_cross_cache(model.encoder(torch.randn(2, dims.n_mels, 3000)), cache, 0)
        hidden = backend.eager_step(torch.tensor([[50257], [440]]), torch.tensor([[3], [200]]), cache, [3, 200])
    assert hidden.shape == (2, 1, dims.n_text_state) and torch.isfinite(hidden).all()
