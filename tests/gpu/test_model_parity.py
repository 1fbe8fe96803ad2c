"""large-v3 with dummy weights: encoder output and teacher-forced logits against transformers, same weights."""

import pytest
import torch

from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache
from engine.model.weights import Checkpoint, dummy_state_dict
from engine.model.whisper import Whisper
from tests.helpers.weights_export import hf_configs, to_hf_names


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("size", ["large-v3", "large-v3-turbo"])
def test_matches_transformers(cuda, size):
    transformers = pytest.importorskip("transformers")
    dims = DUMMY_DIMS[size]
    state = dummy_state_dict(dims, dtype=torch.float32, device=cuda)
    config, _ = hf_configs(Checkpoint(dims, state, None, None, None, None, "dummy"))
    hf = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config))
    missing, unexpected = hf.load_state_dict(to_hf_names(state), strict=False)
    assert not unexpected and set(missing) <= {"proj_out.weight"}
    hf.tie_weights()
    hf = hf.to(cuda).eval()

    gen = torch.Generator(cuda).manual_seed(0)
    mel = torch.randn(1, dims.n_mels, 3000, device=cuda, generator=gen)
    tokens = torch.randint(0, 50000, (1, 24), device=cuda, generator=gen)
    with torch.inference_mode():
        ref_enc = hf.model.encoder(mel).last_hidden_state
        ref_logits = hf(input_features=mel, decoder_input_ids=tokens).logits
    del hf
    torch.cuda.empty_cache()

    results = {}
    for dtype in (torch.float32, torch.float16):
        model = Whisper(dims)
        model.load_state_dict(state)
        model = model.to(cuda, dtype).eval()
        cache = KVCache(CacheShape.for_model(dims, None, None), 1, dtype, cuda)
        with torch.inference_mode():
            enc = model.encoder(mel.to(dtype))
            model.decoder.fill_cross_cache(enc, cache, 0)
            n = tokens.shape[1]
            pos = torch.arange(n, device=cuda)[None]
            mask = (pos[:, None, :, None] >= pos[:, None, None, :])
            logits = model.decoder.logits(model.decoder(tokens, pos, cache, 0, n, mask))
        results[dtype] = (rel_err(enc, ref_enc), rel_err(logits, ref_logits))
        del model, cache
    print(f"\n{size}: rel err fp32 enc {results[torch.float32][0]:.2e} logits {results[torch.float32][1]:.2e}; "
          f"fp16 enc {results[torch.float16][0]:.2e} logits {results[torch.float16][1]:.2e}")
    assert results[torch.float32][0] < 1e-4 and results[torch.float32][1] < 1e-4
    assert results[torch.float16][0] < 1e-2 and results[torch.float16][1] < 1e-2
