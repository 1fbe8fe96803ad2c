"""Whisper's logit rules, vectorized over the batch, and the sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.kernels import greedy_pick, row_logsumexp
from engine.keywords import START_GATE
from engine.model.tokenizer import Tokenizer

NEG_INF = float("-inf")


@dataclass(slots=True)
class StepRules:
    """
    Which rows each rule applies to, built on the host from each sequence's state. A rule that
    applies to no row is None, so the common step (greedy text, no timestamps) touches the logits once.
    Row selectors are int64 index tensors; the timestamp fields are per timestamp row.
    """

    is_first: Tensor | None = None  # rows sampling their window's first token: begin-suppress
    suppress_eot: Tensor | None = None  # rows decoding a fixed number of tokens (benchmarks)
    detect_language: Tensor | None = None  # rows whose next token is the language
    banned_languages: tuple[Tensor, Tensor] | None = None  # (rows, language tokens) a request's languages exclude
    # (rows, tokens, logit bonuses): keyword biasing; a negative value is a bonus of its size that applies only
    # where the token is within START_GATE of its row's best logit
    bonus: tuple[Tensor, Tensor, Tensor] | None = None
    with_timestamps: Tensor | None = None  # rows decoding with timestamp rules
    last_is_ts: Tensor | None = None  # (n_ts,) bool
    penultimate_is_ts: Tensor | None = None  # (n_ts,) bool
    min_timestamp: Tensor | None = None  # (n_ts,) int64: timestamps never decrease
    is_first_ts: Tensor | None = None  # (n_ts,) bool


class LogitsProcessor:
    """Suppress lists, begin-suppress, timestamp rules (openai/whisper's ApplyTimestampRules) and language picks."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        n_vocab: int,
        suppress_tokens: list[int],
        begin_suppress_tokens: list[int],
        max_initial_timestamp_index: int,
        device: torch.device,
    ):
        self.eot = tokenizer.eot
        self.eot_index = torch.tensor([tokenizer.eot], device=device)
        self.ts_begin = tokenizer.timestamp_begin
        self.no_timestamps = tokenizer.no_timestamps
        self.max_initial_offset = max_initial_timestamp_index
        self.ts_offsets = torch.arange(n_vocab - self.ts_begin, device=device)
        self.suppress_ids = torch.tensor(sorted({i for i in suppress_tokens if 0 <= i < n_vocab}), device=device)
        self.begin_suppress_ids = torch.tensor(sorted(set(begin_suppress_tokens)), device=device)
        self.language_ids = frozenset(tokenizer.language_ids.values())  # a request's languages may exclude some
        self.not_language = ~self._mask(list(self.language_ids), n_vocab, device)
        # `logits[rows, cols] = float("-inf")` copies the scalar to the GPU from pageable memory, which waits for
        # every queued kernel: the host would sit idle until the decoder step finished instead of queueing the rules
        # and the sampling behind it. A device value does not.
        self.neg_inf = torch.tensor(NEG_INF, device=device)

    @staticmethod
    def _mask(ids: list[int], n_vocab: int, device: torch.device) -> Tensor:
        mask = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        mask[[i for i in ids if 0 <= i < n_vocab]] = True
        return mask

    def __call__(self, logits: Tensor, r: StepRules) -> Tensor:
        """logits : (batch, n_vocab) float32, modified in place and returned."""
        logits.index_fill_(1, self.suppress_ids, NEG_INF)
        if r.is_first is not None:
            logits.index_put_((r.is_first[:, None], self.begin_suppress_ids), self.neg_inf)
        if r.suppress_eot is not None:
            logits.index_put_((r.suppress_eot, self.eot_index), self.neg_inf)
        if r.bonus is not None:  # before the timestamp rules, which weigh text against timestamps
            rows, tokens, values = r.bonus
            near = logits[rows, tokens] >= logits.amax(dim=-1)[rows] - START_GATE
            values = torch.where((values > 0) | near, values.abs(), 0.0).to(logits.dtype)
            logits.index_put_((rows, tokens), values, accumulate=True)
        if r.with_timestamps is not None:
            self._timestamp_rules(logits, r)
        if r.detect_language is not None:
            rows = logits[r.detect_language]
            logits[r.detect_language] = rows.masked_fill(self.not_language, NEG_INF)
            if r.banned_languages is not None:
                logits.index_put_(r.banned_languages, self.neg_inf)
        return logits

    def plain(self, logits: Tensor, no_eot: Tensor, state: Tensor | None = None) -> Tensor:
        """The rules of a step in which every row samples greedily past its first token: the suppress list, EOT where
        `no_eot` (bool, per row) holds and, given every row's rule `state` (see timestamp_inputs), the timestamp
        rules; the same edits as __call__ makes for such rows, with static shapes and no host values, so a CUDA
        graph can replay them (multi-step decoding)."""
        logits.index_fill_(1, self.suppress_ids, NEG_INF)
        logits[:, self.eot].masked_fill_(no_eot, NEG_INF)
        if state is not None:
            rules = StepRules(with_timestamps=torch.arange(len(logits), device=logits.device))
            self.timestamp_inputs(rules, state)
            self._timestamp_rules(logits, rules)
        return logits

    def timestamp_inputs(self, rules: StepRules, state: Tensor) -> None:
        """The timestamp rules' inputs for rows rules.with_timestamps, from the rule state: per row of a batch its
        last token, the one before (-1: none) and its last timestamp token (-1: none)."""
        ts_begin = self.ts_begin
        last, penult, last_ts = state[rules.with_timestamps].unbind(1)
        rules.last_is_ts = last >= ts_begin
        rules.penultimate_is_ts = (penult < 0) | (penult >= ts_begin)  # fewer than two tokens counts as one
        rules.is_first_ts = last < 0
        # a lone timestamp may be repeated once to close its segment
        step = (~(rules.last_is_ts & ~rules.penultimate_is_ts)).long()
        rules.min_timestamp = torch.where(last_ts < 0, ts_begin, last_ts + step)

    def next_state(self, state: Tensor, tokens: Tensor) -> Tensor:
        """The rule state after sampling `tokens` (one per row): it becomes the last token, and the last timestamp
        if it is one."""
        last_ts = torch.where(tokens >= self.ts_begin, tokens, state[:, 2])
        return torch.stack((tokens, state[:, 0], last_ts), dim=1)

    def _timestamp_rules(self, logits: Tensor, r: StepRules) -> None:
        """openai/whisper's ApplyTimestampRules on the rows that decode with timestamps."""
        rows = r.with_timestamps
        x = logits[rows]  # (n, n_vocab) copy of the timestamp rows; written back at the end
        x[:, self.no_timestamps] = NEG_INF
        ts, text = x[:, self.ts_begin :], x[:, : self.eot]  # views into x
        # after a pair of timestamps comes text (or EOT); after a lone timestamp comes another timestamp
        ts.masked_fill_((r.last_is_ts & r.penultimate_is_ts)[:, None], NEG_INF)
        text.masked_fill_((r.last_is_ts & ~r.penultimate_is_ts)[:, None], NEG_INF)
        # timestamps never go backwards
        ts.masked_fill_(self.ts_offsets < (r.min_timestamp - self.ts_begin)[:, None], NEG_INF)
        # a window starts with a timestamp, no later than max_initial_timestamp
        first = r.is_first_ts[:, None]
        x[:, : self.ts_begin].masked_fill_(first, NEG_INF)
        ts.masked_fill_(first & (self.ts_offsets > self.max_initial_offset), NEG_INF)
        # if all timestamps together are likelier than any single text token, sample a timestamp
        logprobs = torch.log_softmax(x, dim=-1)  # one block per row, whatever the rows: row-invariant
        ts = logprobs[:, self.ts_begin :]
        ts_logprob = row_logsumexp.logsumexp_rows(ts) if row_logsumexp.applies(ts) else ts.logsumexp(dim=-1)
        text_max = logprobs[:, : self.ts_begin].amax(dim=-1)
        x[:, : self.ts_begin].masked_fill_((ts_logprob > text_max)[:, None], NEG_INF)
        logits[rows] = x


def sample(
    logits: Tensor, temperatures: list[float], generators: list[torch.Generator | None], greedy_kernel: bool = True
) -> tuple[Tensor, Tensor]:
    """Greedy where temperature is 0, else seeded sampling; returns (tokens, their log-probabilities).
    `greedy_kernel` (KernelOptions.greedy_pick): an all-greedy step on a GPU in one pass (kernels/greedy_pick.py)."""
    kernel = logits.device.type != "cpu" and greedy_kernel and greedy_pick.applies(logits)
    if kernel:
        # every row's pick and normalizer from rows reduced one by one: a greedy row's log-probability (which the
        # temperature fallback compares with a threshold) does not depend on whether another row samples
        tokens, logprobs, row_max, log_sum = greedy_pick.greedy_pick(logits)
    elif logits.device.type == "cpu":
        # torch's CPU argmax over a 51,864-wide row runs a scalar loop (60-110 us, 2-cores x86), numpy's is
        # vectorized (~6 us); both return the first of equal maxima, so the pick is the same
        tokens = torch.from_numpy(logits.numpy().argmax(axis=-1))
    else:
        tokens = logits.argmax(dim=-1)
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
