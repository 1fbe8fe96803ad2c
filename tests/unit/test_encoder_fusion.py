"""The encoder's fused q/k/v product (used on a GPU) computes what the three separate products do."""

import torch

from engine.model.dims import DUMMY_DIMS
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper


def test_fused_qkv_encoder_matches_separate_products():
    dims = DUMMY_DIMS["tiny"]
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    model = model.eval().requires_grad_(False)
    mel = torch.randn(2, dims.n_mels, 3000, generator=torch.Generator().manual_seed(0))
    params = sum(p.numel() for p in model.encoder.parameters())
    assert not any(block.attn.is_fused for block in model.encoder.blocks)
    with torch.inference_mode():
        separate = model.encoder(mel)
        model.encoder.fuse_qkv()
        fused = model.encoder(mel)
    assert all(block.attn.is_fused for block in model.encoder.blocks)
    assert sum(p.numel() for p in model.encoder.parameters()) == params  # the projections are views of it
    torch.testing.assert_close(fused, separate, rtol=1e-4, atol=1e-4)
