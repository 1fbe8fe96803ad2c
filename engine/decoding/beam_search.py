"""Beam search inside the shared batch: a window's beams are rows of the running batch.

The device ranks: each step, every beam group's candidates (its beams' running scores plus their next-token
log-probabilities, over beams x vocabulary) are cut to the best 2B on the device, and only those 2B values and
indices come to the host (`candidates`). The host applies CTranslate2's rules (faster-whisper's beam search;
docs/design/beam-search-reference.md), which decide the next beams and the finished hypotheses (`BeamGroup.advance`).

A beam keeps its row while it lives. When beams reorder, a parent's first child continues in the parent's row
without a copy; only a second child of one parent takes the row of a beam that had none, and gets its parent's
self-attention prefix copied there (`KVCache.copy_self`, one call for every group's copies of a step). The beams
of a window read one cross slot, written by the one encoder pass of the window (engine/model/kv_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

NEG_INF = float("-inf")


class Beam(Protocol):
    """What a beam search reads and writes of each of its members (engine/runtime/sequence.py's Sequence is one)."""

    job: Any  # its window's: beam_size, and the request's options (patience, length_penalty)
    slot: int
    tokens: list[int]
    logprobs: list[float]
    sum_logprob: float
    last_timestamp: int
    pending: list[int]
    finished: bool
    beam: BeamGroup | None
    host_bound: bool

    @property
    def fixed_decode_tokens(self) -> int | None: ...

    @property
    def sampling(self) -> bool: ...


@dataclass(slots=True)
class Hypothesis:
    """A finished beam: its tokens (<|endoftext|> excluded), their log-probabilities and its raw score (the sum
    of its tokens' log-probabilities, <|endoftext|>'s included when it ended with one)."""

    tokens: list[int]
    logprobs: list[float]
    score: float
    last_timestamp: int


@dataclass(eq=False)
class BeamGroup:
    """The beams of one window: `members[b]` is beam b's sequence (its slot and row while the window decodes).

    `patience` and `length_penalty` are faster-whisper's: the search ends once round(beam_size * patience)
    hypotheses have finished, and hypotheses are ranked by score / length ** length_penalty."""

    members: list[Beam]
    patience: float = 1.0
    length_penalty: float = 1.0
    scores: list[float] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    step: int = 0
    max_steps: int | None = None
    candidates: tuple[list[float], list[int]] | None = None  # this step's 2B best (values, flat indices), read back

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def done(self) -> bool:
        return self.leader.finished

    @property
    def leader(self) -> Beam:
        """The member that carries the window's result once the search ends."""
        return self.members[0]

    def running_scores(self) -> list[float]:
        """Each beam's score entering this step: at the first, only beam 0 is expanded (all beams hold the same
        prompt, so the others would only repeat its candidates)."""
        if self.step == 0:
            return [0.0] + [NEG_INF] * (self.size - 1)
        return self.scores

    def advance(self, vocab: int, eot: int, timestamp_begin: int, num_cached: int, n_text_ctx: int,
                copies: list[tuple[int, int]]) -> None:  # fmt: skip
        """Apply one step's candidates: finished hypotheses are kept, the beams move to the best candidates that
        do not end, and the search ends after enough hypotheses or the last allowed step. `num_cached`: positions
        cached after this step. Where a parent has two children, (parent's row, child's row) joins `copies`: the
        caller copies those self-attention prefixes before the next step."""
        assert self.candidates is not None
        values, indices = self.candidates
        self.candidates = None
        size = self.size
        if self.max_steps is None:  # CTranslate2: at most half the context, and never past it
            fixed = self.leader.fixed_decode_tokens
            start = num_cached - 1  # the position of the last prompt token
            self.max_steps = fixed if fixed is not None else min(n_text_ctx // 2, n_text_ctx - start)
        last_step = self.step + 1 >= self.max_steps
        # the members' lists are replaced, never changed in place, so these stay each parent's history
        parents = [(m.tokens, m.logprobs, m.last_timestamp) for m in self.members]
        old_scores = self.running_scores()
        chosen: list[tuple[int, int, float]] = []  # (parent beam, token, score) of the next beams
        refill = size
        early_end = False
        for rank in range(size):
            parent, token = divmod(indices[rank], vocab)
            value = values[rank]
            if token == eot or last_step:
                tokens, logprobs, last_ts = parents[parent]
                logprob = value - old_scores[parent]
                if token != eot:
                    tokens, logprobs = tokens + [token], logprobs + [logprob]
                    last_ts = token if token >= timestamp_begin else last_ts
                self.finished.append(Hypothesis(tokens, logprobs, value, last_ts))
                early_end = early_end or (rank == 0 and token == eot)
                while refill < len(indices) and indices[refill] % vocab == eot:
                    refill += 1
                if refill < len(indices):
                    chosen.append((*divmod(indices[refill], vocab), values[refill]))
                    refill += 1
            else:
                chosen.append((parent, token, value))
        self.step += 1
        if last_step or self._enough(early_end):
            self._finish()
            return
        self._move(chosen[:size], parents, old_scores, timestamp_begin, copies)

    def _enough(self, top_ended: bool) -> bool:
        if self.length_penalty == 0:  # CTranslate2 ends early when the best candidate ended and enough are kept
            return top_ended and len(self.finished) >= 1
        return len(self.finished) >= max(1, round(self.size * self.patience))

    def _move(self, chosen: list[tuple[int, int, float]], parents: list[tuple[list[int], list[float], int]],
              old_scores: list[float], timestamp_begin: int, copies: list[tuple[int, int]]) -> None:  # fmt: skip
        """The next beams into the members: a parent's first child stays in its row, other children take the
        rows of parents without one, with the parent's self-attention prefix to copy there (`copies`)."""
        members = self.members
        owner: dict[int, int] = {}  # member -> index into chosen
        extra: list[int] = []
        for i, (parent, _, _) in enumerate(chosen):
            if parent not in owner:
                owner[parent] = i
            else:
                extra.append(i)
        free = [b for b in range(self.size) if b not in owner]
        for i, dst in zip(extra, free):
            owner[dst] = i
            copies.append((members[chosen[i][0]].slot, members[dst].slot))
        scores = [NEG_INF] * self.size
        for b, i in owner.items():
            parent, token, value = chosen[i]
            tokens, logprobs, last_ts = parents[parent]
            m = members[b]
            m.tokens = tokens + [token]
            m.logprobs = logprobs + [value - old_scores[parent]]
            m.sum_logprob = value
            m.last_timestamp = token if token >= timestamp_begin else last_ts
            m.pending = [token]
            scores[b] = value
        self.scores = scores

    def _finish(self) -> None:
        """The best hypothesis by length-normalized score becomes the leader's result; every member ends."""
        lp = self.length_penalty
        best = max(self.finished, key=lambda h: h.score / max(1, len(h.tokens)) ** lp)
        lead = self.leader
        lead.tokens, lead.logprobs, lead.sum_logprob = best.tokens, best.logprobs, best.score
        lead.last_timestamp = best.last_timestamp
        for m in self.members:
            m.finished = True


class BeamSearch:
    """Beam search as rows of the batch, the one object the engine calls for it: `admit` groups a window's rows,
    `rank` queues each group's best candidates on the device behind the step, and `advance` applies them once read,
    returning the self-attention prefixes to copy where a beam forks."""

    def __init__(self, vocab: int, eot: int, timestamp_begin: int, n_text_ctx: int):
        self.vocab = vocab
        self.eot = eot
        self.timestamp_begin = timestamp_begin
        self.n_text_ctx = n_text_ctx

    def admit(self, rows: list[Beam]) -> list[BeamGroup]:
        """New rows: the rows of a window decoded with beam search (`job.beam_size` of them, one cross slot) become
        its beams, with its request's patience and length penalty; their steps are read before the next launch, as
        the next beams are chosen on the host."""
        windows: dict[int, list[Beam]] = {}
        for row in rows:
            if row.job.beam_size > 1:
                windows.setdefault(id(row.job), []).append(row)
        groups = []
        for members in windows.values():
            options = members[0].job.options
            group = BeamGroup(members, options.patience, options.length_penalty)
            for m in members:
                m.beam = group
                m.host_bound = True
            groups.append(group)
        return groups

    def rank(self, logits: Tensor, seqs: list[Beam], to_device) -> tuple[Tensor, Callable[[list[float]], None]] | None:
        """Each group choosing its next tokens in this step: its best 2B (beam, token) candidates by running score
        plus log-probability, on the device; returns them (G * 4B float64: per group 2B values then 2B flat indices,
        beam * vocab + token) and the reader that hands each group its part once the step is read. None: no beams."""
        chosen = {id(s.beam): s.beam for s in seqs if s.beam is not None and s.sampling}
        if not chosen:  # the common step: no row map built
            return None
        row = {id(s): i for i, s in enumerate(seqs)}
        by_size: dict[int, list[BeamGroup]] = {}
        for g in chosen.values():
            by_size.setdefault(g.size, []).append(g)
        parts, order = [], []
        for size, groups in by_size.items():  # groups of one beam size share one top-k
            rows = to_device([[row[id(m)] for m in g.members] for g in groups])  # (G, B)
            scores = to_device([g.running_scores() for g in groups]).float()
            logp = torch.log_softmax(logits[rows].float(), dim=-1)  # (G, B, V)
            # the float32 sums are those of CTranslate2's float32 beam search
            values, indices = (scores[:, :, None] + logp).flatten(1).topk(2 * size, dim=-1)
            parts.append(torch.cat([values.double(), indices.double()], dim=1).flatten())
            order += groups

        def read(out: list[float]) -> None:
            at = 0
            for group in order:
                k = 2 * group.size
                group.candidates = (out[at : at + k], [int(i) for i in out[at + k : at + 2 * k]])
                at += 2 * k

        return torch.cat(parts), read

    def advance(self, led: list[tuple[BeamGroup, int]]) -> tuple[list[tuple[int, int]], int, int]:
        """Each read group with its positions cached after the step: the next beams or the end. Returns the
        self-attention copies to make (parent's row, child's row) before the next step, how many positions they
        cover and how many tokens the groups took."""
        copies: list[tuple[int, int]] = []
        positions = tokens = 0
        for group, num_cached in led:
            group.advance(self.vocab, self.eot, self.timestamp_begin, num_cached, self.n_text_ctx, copies)
            positions = max(positions, num_cached)  # positions past a row's own are never read
            tokens += group.size
        return copies, positions, tokens
