"""The batch-invariant mode's CPU-side parts: it is a GPU backend (refused off a GPU, never picked for a CPU),
and a chunked request's windows each sample from a generator of their own."""

from __future__ import annotations

import torch

from engine.backends import select_backend
from engine.backends.gpu_invariant import unsupported_reason
from engine.kernels.options import KernelOptions
from engine.model.dims import ModelDimensions
from engine.model.whisper import Whisper
from engine.transcription.chunked import window_seed

TINY = ModelDimensions(
    n_mels=80, n_audio_ctx=16, n_audio_state=64, n_audio_head=1, n_audio_layer=1,
    n_vocab=64, n_text_ctx=8, n_text_state=64, n_text_head=1, n_text_layer=1,
)  # fmt: skip


def test_a_cpu_keeps_its_own_backend_and_the_gpu_mode_says_why_it_does_not_apply():
    model = Whisper(TINY).eval()
    backend = select_backend(model, torch.device("cpu"), torch.float32, False, KernelOptions(batch_invariant=True))
    assert not backend.batch_invariant
    assert "GPU" in unsupported_reason(model, torch.device("cpu"))


def test_each_window_of_a_chunked_request_has_its_own_seed():
    seeds = [window_seed(7, i) for i in range(50)]
    assert len(set(seeds)) == 50 and seeds == [window_seed(7, i) for i in range(50)]
    assert window_seed(8, 0) != window_seed(7, 0) and all(0 <= s < 2**63 for s in seeds)
    draws = [torch.randint(0, 1000, (4,), generator=torch.Generator().manual_seed(s)).tolist() for s in seeds[:2]]
    assert draws[0] != draws[1]
