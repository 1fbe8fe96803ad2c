"""engine/kernels/greedy_pick.py: a greedy step's token and log-probability against torch's argmax and log_softmax."""

import pytest
import torch

from engine.decoding import Sampler
from engine.kernels import greedy_pick


@pytest.mark.parametrize("rows,vocab", [(1, 51866), (5, 51865), (256, 51866), (3, 4096)])
def test_pick_matches_argmax_and_log_softmax(cuda, rows, vocab):
    gen = torch.Generator(cuda).manual_seed(rows)
    x = torch.randn(rows, vocab, device=cuda, generator=gen) * 4
    x[:, 100:200] = float("-inf")  # suppressed tokens
    if vocab > greedy_pick.BLOCK:
        x[0, : greedy_pick.BLOCK] = float("-inf")  # a program's whole block suppressed
    x[-1, 3000] = x[-1, 3500] = x[-1].max() + 1  # equal maxima: the first index, as argmax picks
    assert greedy_pick.applies(x)
    tokens, logprobs, row_max, log_sum = greedy_pick.greedy_pick(x)
    want = x.argmax(dim=-1)
    assert torch.equal(tokens, want) and tokens[-1].item() == 3000
    ref = torch.log_softmax(x, dim=-1).gather(1, want[:, None]).squeeze(1)
    assert (logprobs - ref).abs().max().item() < 1e-5
    # the normalizer gives any token's log-probability, and the greedy one's bitwise
    assert torch.equal(row_max, x.max(dim=-1).values)
    assert torch.equal((x.gather(1, tokens[:, None]).squeeze(1) - row_max) - log_sum, logprobs)
    assert ((x - row_max[:, None]) - log_sum[:, None] - torch.log_softmax(x, dim=-1)).nan_to_num().abs().max() < 1e-4
    # each row reduced alone: the same results for a row whatever the other rows
    if rows > 1:
        assert all(
            torch.equal(a[1:], b)
            for a, b in zip(greedy_pick.greedy_pick(x), greedy_pick.greedy_pick(x[1:].contiguous()))
        )


def test_sample_draws_rows_at_temperature_and_keeps_the_greedy_rows(cuda):
    gen = torch.Generator(cuda).manual_seed(3)
    x = torch.randn(4, 51866, device=cuda, generator=gen) * 4
    sample = Sampler(x.device)
    greedy = sample(x, [0.0] * 4, [None] * 4)
    assert torch.equal(greedy[0], x.argmax(dim=-1))
    assert (greedy[1] - torch.log_softmax(x, dim=-1).max(dim=-1).values).abs().max().item() < 1e-5
    draws = sample(x, [0.0, 1.0, 0.0, 0.0], [None, torch.Generator().manual_seed(0), None, None])
    assert torch.equal(draws[0][[0, 2, 3]], greedy[0][[0, 2, 3]])
    assert torch.equal(draws[1][[0, 2, 3]], greedy[1][[0, 2, 3]])  # a greedy row's log-probability as if all were
    picked = torch.log_softmax(x, dim=-1).gather(1, draws[0][:, None]).squeeze(1)
    assert torch.allclose(draws[1], picked)
