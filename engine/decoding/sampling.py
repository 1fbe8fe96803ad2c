"""The sampler: greedy or seeded draws per row, with each pick's log-probability."""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kernels import greedy_pick


class Sampler:
    """How a device picks a step's tokens, chosen once: on a GPU an all-greedy step in one pass
    (kernels/greedy_pick.py, unless KernelOptions.greedy_pick is off), on a CPU numpy's argmax."""

    def __init__(self, device: torch.device, greedy_kernel: bool = True):
        self.kernel = device.type == "cuda" and greedy_kernel
        # torch's CPU argmax over a vocabulary-wide row runs a scalar loop, numpy's is vectorized; both return the
        # first of equal maxima, so the pick is the same
        self.argmax = _numpy_argmax if device.type == "cpu" else _torch_argmax

    def __call__(
        self, logits: Tensor, temperatures: list[float], generators: list[torch.Generator | None]
    ) -> tuple[Tensor, Tensor]:
        """Greedy where temperature is 0, else seeded sampling; returns (tokens, their log-probabilities)."""
        kernel = self.kernel and greedy_pick.applies(logits)
        if kernel:
            # every row's pick and normalizer from rows reduced one by one: a greedy row's log-probability (which
            # the temperature fallback compares with a threshold) does not depend on whether another row samples
            tokens, logprobs, row_max, log_sum = greedy_pick.greedy_pick(logits)
        else:
            tokens = self.argmax(logits)
        drawn = []
        for i, (t, gen) in enumerate(zip(temperatures, generators)):
            # Few rows ever sample (temperature fallback), so a per-row draw with the request's own
            # generator keeps results reproducible whatever else shares the batch.
            if t > 0:
                probs = torch.softmax(logits[i] / t, dim=-1).cpu()
                if torch.isfinite(probs).all():  # else keep the greedy pick rather than fail the draw
                    tokens[i] = torch.multinomial(probs, 1, generator=gen).to(tokens.device)[0]
                    drawn.append(i)
        if not kernel:
            return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
        if drawn:
            rows = torch.tensor(drawn, device=logits.device)
            logprobs[rows] = (logits[rows, tokens[rows]] - row_max[rows]) - log_sum[rows]
        return tokens, logprobs


def _numpy_argmax(logits: Tensor) -> Tensor:
    return torch.from_numpy(logits.numpy().argmax(axis=-1))


def _torch_argmax(logits: Tensor) -> Tensor:
    return logits.argmax(dim=-1)
