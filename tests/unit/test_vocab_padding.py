"""The output projection's padded weight (used on a GPU) gives the same logits; the embedding is a view of it."""

import torch

from engine.backends.gpu import VOCAB_PADDING, GpuBackend
from engine.kernels.options import KernelOptions
from engine.model.dims import DUMMY_DIMS
from engine.model.weights import dummy_state_dict
from engine.model.whisper import Whisper


def test_padded_vocabulary_gives_the_same_logits_without_a_copy():
    dims = DUMMY_DIMS["tiny"]  # 51,865 tokens: not a multiple of the padding
    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(dummy_state_dict(dims), strict=True, assign=True)
    decoder = model.eval().requires_grad_(False).decoder
    hidden = torch.randn(3, 1, dims.n_text_state, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([[50258], [1000], [dims.n_vocab - 1]])
    with torch.inference_mode():
        embedded, plain = decoder.token_embedding(tokens), decoder.logits(hidden)
        params = sum(p.numel() for p in decoder.parameters())
        # the GPU backend built on this CPU: its layout and projection, without the GPU-only kernels
        backend = GpuBackend(model, KernelOptions(), torch.float32, torch.device("cpu"), fp8=False)
        weight = backend.output_weight
        padded = backend.logits(hidden)
        into = torch.full((3, 1, dims.n_vocab), float("nan"))
        returned = backend.logits(hidden, out=into)
        embedded_after = decoder.token_embedding(tokens)

    assert weight.shape == (-(-dims.n_vocab // VOCAB_PADDING) * VOCAB_PADDING, dims.n_text_state)
    assert dims.n_vocab % VOCAB_PADDING != 0 and not weight[dims.n_vocab :].any()
    assert decoder.token_embedding.weight.data_ptr() == weight.data_ptr()  # a view: no second copy
    assert decoder.token_embedding.weight.shape == (dims.n_vocab, dims.n_text_state)
    assert sum(p.numel() for p in decoder.parameters()) == params
    assert not backend.reads_own_prefix and not backend.fused_lone_row  # no Triton kernels off a GPU
    torch.testing.assert_close(embedded_after, embedded, rtol=0, atol=0)
    assert padded.shape == plain.shape and padded.dtype == torch.float32 and padded.is_contiguous()
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)
    assert returned is into
    torch.testing.assert_close(into, padded, rtol=0, atol=0)
