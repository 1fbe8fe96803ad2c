"""The timestamp rules' kernel (engine/kernels/timestamp_rules.py) against their batched torch form on the GPU:
the same masks on every row, and the same choice of a timestamp wherever the two sides of that choice are not a
near tie; a row's edits do not depend on the rows beside it."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from engine.decoding.rule import RuleSetup
from engine.decoding.timestamps import DeviceRows, TimestampRules
from engine.kernels import timestamp_rules
from tests.unit.test_timestamp_rules import _states

# tiny.en's special tokens
TOK = SimpleNamespace(eot=50256, timestamp_begin=50363, no_timestamps=50362)
N_VOCAB = 51864


def test_the_kernel_edits_the_logits_as_the_batched_form_does(cuda):
    rules = TimestampRules(RuleSetup(TOK, N_VOCAB, cuda, [], [], 50))
    assert not rules.on_host and timestamp_rules.applies(torch.zeros(1, N_VOCAB, device=cuda))
    rng, g = random.Random(0), torch.Generator(cuda).manual_seed(0)
    chose, compared = 0, 0
    for trial in range(60):
        batch = rng.randrange(1, 65)
        state = _states(TOK, rng, batch).to(cuda)
        logits = torch.randn(batch, N_VOCAB, generator=g, device=cuda) * 3
        if trial % 2:  # timestamps made likely, so the last rule fires too
            logits[:, TOK.timestamp_begin :] += rng.choice([2.0, 4.0, 6.0])
        rows = sorted(rng.sample(range(batch), rng.randrange(1, batch + 1)))
        index = torch.tensor(rows, device=cuda)
        expected, got = logits.clone(), logits.clone()
        rules.apply(expected, rules.state_inputs(index, state))  # the torch form
        rules.apply(got, DeviceRows(index, state))
        others = [r for r in range(batch) if r not in rows]
        assert torch.equal(got[others], logits[others])  # rows without timestamps untouched
        # the masks before the last rule: equal wherever neither side masked all the text
        text_masked = torch.isinf(got[:, : TOK.timestamp_begin]).all(-1)
        expected_text_masked = torch.isinf(expected[:, : TOK.timestamp_begin]).all(-1)
        ts_lse = expected[:, TOK.timestamp_begin :].logsumexp(-1)
        text_max = torch.where(expected_text_masked[:, None], logits, expected)[:, : TOK.timestamp_begin].amax(-1)
        near = (ts_lse - text_max).abs() < 1e-4
        for r in rows:
            if near[r]:
                continue
            assert bool(text_masked[r]) == bool(expected_text_masked[r]), (trial, r)
            assert torch.equal(got[r], expected[r]), (trial, r, state[r].tolist())
            compared += 1
        chose += int(text_masked[rows].sum())
        # alone, a row gets the edits it got among the others
        alone = logits[rows[:1]].clone()
        rules.apply(alone, DeviceRows(torch.zeros(1, dtype=torch.long, device=cuda), state[rows[:1]]))
        assert torch.equal(alone[0], got[rows[0]])
    assert chose > 0 and compared > 100
