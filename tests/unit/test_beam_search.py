"""BeamSearch's rules on hand-made candidates, through its interface (admit, then advance once a step's candidates
are read): CTranslate2's finishing and refill, reordering with the fewest
self-attention copies, and the length-normalized pick."""

from __future__ import annotations

import math

import pytest
import torch

from engine.decoding.beam_search import BeamGroup, BeamSearch
from engine.request import DecodeOptions
from engine.runtime.sequence import Sequence, WindowJob

V, EOT, TS = 100, 50, 60  # vocabulary, <|endoftext|>, first timestamp token


class FakeCache:
    def __init__(self):
        self.copies: list[tuple[list[tuple[int, int]], int]] = []

    def copy_self(self, copies, num_positions):
        self.copies.append((copies, num_positions))


SEARCH = BeamSearch(V, EOT, TS, 448)


def group(size: int, patience: float = 1.0, length_penalty: float = 1.0) -> BeamGroup:
    options = DecodeOptions(beam_size=size, patience=patience, length_penalty=length_penalty)
    job = WindowJob("req", torch.zeros(1), [1], 0.0, False, options=options, beam_size=size)
    (g,) = SEARCH.admit([Sequence(job=job, slot=10 + b) for b in range(size)])
    assert all(m.beam is g and m.host_bound for m in g.members)
    return g


def step(g: BeamGroup, cache: FakeCache, picks: list[tuple[int, int, float]], num_cached: int = 4) -> None:
    """Feed one step's 2B candidates, (beam, token, score) best first."""
    g.candidates = ([p[2] for p in picks], [p[0] * V + p[1] for p in picks])
    copies, positions, _ = SEARCH.advance([(g, num_cached)])
    if copies:
        cache.copy_self(copies, positions)


def test_first_step_expands_one_beam_and_later_children_copy_only_when_a_parent_forks():
    g, cache = group(2), FakeCache()
    assert g.running_scores() == [0.0, -math.inf]
    step(g, cache, [(0, 7, -0.1), (0, 8, -0.5), (0, 9, -1.0), (0, 3, -2.0)])
    # both children of beam 0: the first stays in its slot, the second takes beam 1's with a copy of the prefix
    assert [m.tokens for m in g.members] == [[7], [8]]
    assert cache.copies == [([(10, 11)], 4)]
    assert g.scores == [-0.1, -0.5] and [m.pending for m in g.members] == [[7], [8]]
    assert g.members[1].logprobs == [pytest.approx(-0.5)]
    # beam 1's child ranks first: it continues in beam 1's slot, beam 0's in its own; no copy
    step(g, cache, [(1, 20, -0.6), (0, 21, -0.7), (1, 22, -0.9), (0, 23, -1.2)], num_cached=5)
    assert [m.tokens for m in g.members] == [[7, 21], [8, 20]]
    assert len(cache.copies) == 1
    assert g.members[1].logprobs == [pytest.approx(-0.5), pytest.approx(-0.1)]


def test_an_ending_candidate_among_the_best_finishes_and_its_place_is_refilled():
    g, cache = group(2), FakeCache()
    step(g, cache, [(0, 7, -0.1), (0, 8, -0.5), (0, 9, -1.0), (0, 3, -2.0)])
    # rank 0 ends: a hypothesis with log p(eot) in its score; the refill skips the ending candidate at rank 2
    step(g, cache, [(0, EOT, -0.3), (1, 20, -0.6), (1, EOT, -0.8), (0, 21, -0.9)], num_cached=5)
    assert [(h.tokens, h.score) for h in g.finished] == [([7], -0.3)]
    assert sorted(m.tokens for m in g.members) == [[7, 21], [8, 20]]
    assert not g.done
    # the second finished hypothesis ends the search (round(2 * 1.0)); an ending candidate ranked below the
    # beams is not kept
    step(g, cache, [(0, EOT, -1.0), (1, 30, -1.1), (1, 31, -1.2), (1, EOT, -1.3)], num_cached=6)
    assert g.done and all(m.finished for m in g.members)
    assert len(g.finished) == 2
    # by score / length: [7] at -0.3 / 1 beats the other at -1.0 / 2
    assert g.leader.tokens == [7] and g.leader.sum_logprob == -0.3


def test_length_penalty_and_patience():
    g, cache = group(2, patience=2.0, length_penalty=0.0), FakeCache()
    assert g.size == 2
    step(g, cache, [(0, 7, -0.1), (0, 8, -0.5), (0, 9, -1.0), (0, 3, -2.0)])
    step(g, cache, [(0, EOT, -0.3), (1, 20, -0.6), (1, 21, -0.8), (0, 22, -0.9)], num_cached=5)
    assert g.done  # length_penalty 0: CTranslate2 stops once the best candidate ends
    g, cache = group(2, patience=2.0), FakeCache()
    step(g, cache, [(0, 7, -0.1), (0, 8, -0.5), (0, 9, -1.0), (0, 3, -2.0)])
    step(g, cache, [(0, EOT, -0.3), (1, EOT, -0.6), (1, 21, -0.8), (0, 22, -0.9)], num_cached=5)
    assert not g.done  # patience 2: four hypotheses are needed


def test_the_last_allowed_step_keeps_every_beam_as_a_hypothesis():
    g, cache = group(2), FakeCache()
    g.max_steps = 2
    step(g, cache, [(0, 7, -0.1), (0, TS + 3, -0.5), (0, 9, -1.0), (0, 3, -2.0)])
    step(g, cache, [(0, 11, -0.2), (1, 12, -0.6), (0, 13, -0.9), (1, 14, -1.2)], num_cached=5)
    assert g.done
    assert sorted(h.tokens for h in g.finished) == [[7, 11], [TS + 3, 12]]
    assert g.leader.tokens == [7, 11]
    assert g.finished[1].last_timestamp == TS + 3


def test_a_job_holds_its_beam_count():
    job = WindowJob(request_id="req-0", mel=None, prompt=[], temperature=0.0, detect_language=False, beam_size=5)  # type: ignore[arg-type]
    assert job.beam_size == 5
