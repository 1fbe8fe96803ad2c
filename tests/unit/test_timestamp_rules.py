"""The timestamp rules' two forms make the same edits: the CPU's per-row slices (HostRows) and the batched operations
a GPU replays (TimestampInputs), over random logits and every kind of state a row can be in."""

from __future__ import annotations

import dataclasses
import random

import torch

from engine.decoding import logits_processor
from engine.decoding.rule import RuleSetup
from engine.decoding.timestamps import HostRows, TimestampRules
from engine.model.dims import DUMMY_DIMS
from engine.model.tokenizer import Tokenizer
from engine.model.weights import resolve_model


def _rules() -> tuple[TimestampRules, TimestampRules, Tokenizer]:
    resolved = resolve_model("tiny.en")
    dims = DUMMY_DIMS["tiny.en"]
    tok = Tokenizer.for_model(resolved.config_dir / "tokenizer.json", dims)
    setup = RuleSetup(tok, dims.n_vocab, torch.device("cpu"), [], [], 50)
    host = TimestampRules(setup)
    batched = TimestampRules(setup)
    batched.on_host = False  # the GPU's form, run on CPU tensors
    return host, batched, tok


def _states(tok: Tokenizer, rng: random.Random, n: int) -> torch.Tensor:
    ts, text = tok.timestamp_begin, tok.eot - 1
    rows = []
    for _ in range(n):
        kind = rng.randrange(6)
        last_ts = rng.choice([-1, ts + rng.randrange(0, 1500)])
        if kind == 0:  # a window's first token
            rows.append((-1, -1, -1))
        elif kind == 1:  # one token so far, a timestamp
            rows.append((ts + rng.randrange(0, 50), -1, ts + rng.randrange(0, 50)))
        elif kind == 2:  # a pair of timestamps
            t = ts + rng.randrange(0, 1400)
            rows.append((t + rng.randrange(0, 50), t, t + 10))
        elif kind == 3:  # a lone timestamp after text
            t = ts + rng.randrange(0, 1400)
            rows.append((t, rng.randrange(0, text), t))
        else:  # text
            rows.append((rng.randrange(0, text), rng.choice([rng.randrange(0, text), ts + 3]), last_ts))
    return torch.tensor(rows, dtype=torch.int64)


def test_the_cpu_form_edits_the_logits_as_the_batched_form_does():
    host, batched, tok = _rules()
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    chose_timestamps = 0
    for trial in range(40):
        batch = rng.randrange(1, 9)
        state = _states(tok, rng, batch)
        logits = torch.randn(batch, host.setup.n_vocab, generator=g) * 3
        if trial % 2:  # timestamps made likely, so the last rule (all timestamps against the best text) fires too
            logits[:, tok.timestamp_begin :] += 4
        rows = sorted(rng.sample(range(batch), rng.randrange(1, batch + 1)))
        expected, got = logits.clone(), logits.clone()
        batched.apply(expected, batched.state_inputs(torch.tensor(rows), state))
        host.apply(got, HostRows(rows, state))
        assert torch.equal(got, expected), (trial, rows, state.tolist())
        chose_timestamps += int(torch.isinf(got[rows, : tok.timestamp_begin]).all(dim=-1).sum())
        every_row = logits.clone()
        host.apply_every_row(every_row, state)
        batched.apply_every_row(logits, state)
        assert torch.equal(every_row, logits)
    assert chose_timestamps > 0


def test_the_form_follows_the_device():
    host, _, _ = _rules()
    assert host.on_host
    setup = dataclasses.replace(host.setup, device=torch.device("meta"))
    assert not TimestampRules(setup).on_host


def test_a_launch_of_rows_with_and_without_timestamps_edits_each_as_its_own_kind():
    """The multi-step form (LogitsProcessor.plain) over a batch where only some rows decode with timestamps: those
    rows get the rules' edits, exactly as in a batch of timestamp rows, and the others exactly the edits of a batch
    without timestamps, on both forms of the rules."""
    _, _, tok = _rules()
    dims = DUMMY_DIMS["tiny.en"]
    rng = random.Random(1)
    g = torch.Generator().manual_seed(1)
    for on_host in (True, False):
        processor = logits_processor(RuleSetup(tok, dims.n_vocab, torch.device("cpu"), [], [], 50))
        processor.timestamps.on_host = on_host
        for trial in range(12):
            batch = rng.randrange(2, 10)
            state = _states(tok, rng, batch)
            logits = torch.randn(batch, dims.n_vocab, generator=g) * 3
            logits[:, tok.timestamp_begin :] += 4 * (trial % 2)
            no_eot = torch.rand(batch, generator=g) < 0.3
            stamped = torch.arange(batch) % 2 == trial % 2
            mixed = processor.plain(logits.clone(), no_eot, state, stamped)
            every = processor.plain(logits.clone(), no_eot, state)
            none = processor.plain(logits.clone(), no_eot)
            assert not torch.equal(every, none)  # the rules edited something
            assert torch.equal(mixed[stamped], every[stamped]), trial
            assert torch.equal(mixed[~stamped], none[~stamped]), trial
