"""Whisper's logit rules, vectorized over the batch, and the sampler."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .tokenizer import Tokenizer

NEG_INF = float("-inf")


@dataclass(slots=True)
class StepRules:
    """Per-row flags for one step, built on the host from each sequence's state; each (batch,)."""

    is_first: Tensor  # first sampled token of the window: begin-suppress rules apply
    with_timestamps: Tensor
    last_is_ts: Tensor
    penultimate_is_ts: Tensor
    min_timestamp: Tensor  # lowest timestamp token allowed (timestamps never decrease), int64
    suppress_eot: Tensor  # benchmarks decoding a fixed number of tokens
    detect_language: Tensor  # only language tokens allowed


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
        self.ts_begin = tokenizer.timestamp_begin
        self.no_timestamps = tokenizer.no_timestamps
        self.max_initial_ts = self.ts_begin + max_initial_timestamp_index
        vocab = torch.arange(n_vocab, device=device)
        self.vocab = vocab
        self.suppress = self._mask(suppress_tokens, n_vocab, device)
        self.begin_suppress = self._mask(begin_suppress_tokens, n_vocab, device)
        self.is_timestamp = vocab >= self.ts_begin
        self.is_text = vocab < self.eot
        self.not_language = ~self._mask(list(tokenizer.language_ids.values()), n_vocab, device)

    @staticmethod
    def _mask(ids: list[int], n_vocab: int, device: torch.device) -> Tensor:
        mask = torch.zeros(n_vocab, dtype=torch.bool, device=device)
        mask[[i for i in ids if 0 <= i < n_vocab]] = True
        return mask

    def __call__(self, logits: Tensor, r: StepRules) -> Tensor:
        """logits : (batch, n_vocab) float32, modified in place and returned."""
        logits.masked_fill_(self.suppress, NEG_INF)
        logits.masked_fill_(r.is_first[:, None] & self.begin_suppress, NEG_INF)
        logits.masked_fill_(r.suppress_eot[:, None] & (self.vocab == self.eot), NEG_INF)

        ts = r.with_timestamps[:, None]
        logits.masked_fill_(ts & (self.vocab == self.no_timestamps), NEG_INF)
        # after a pair of timestamps comes text (or EOT); after a lone timestamp comes another timestamp
        pair = (r.last_is_ts & r.penultimate_is_ts)[:, None]
        logits.masked_fill_(ts & pair & self.is_timestamp, NEG_INF)
        lone = (r.last_is_ts & ~r.penultimate_is_ts)[:, None]
        logits.masked_fill_(ts & lone & self.is_text, NEG_INF)
        # timestamps never go backwards
        logits.masked_fill_(ts & self.is_timestamp & (self.vocab < r.min_timestamp[:, None]), NEG_INF)
        # a window starts with a timestamp, no later than max_initial_timestamp
        first = ts & r.is_first[:, None]
        logits.masked_fill_(first & ~self.is_timestamp, NEG_INF)
        logits.masked_fill_(first & (self.vocab > self.max_initial_ts), NEG_INF)
        # if all timestamps together are likelier than any single text token, sample a timestamp
        logprobs = torch.log_softmax(logits, dim=-1)
        ts_logprob = logprobs.masked_fill(~self.is_timestamp, NEG_INF).logsumexp(dim=-1)
        text_max = logprobs.masked_fill(self.is_timestamp, NEG_INF).amax(dim=-1)
        logits.masked_fill_(ts & (ts_logprob > text_max)[:, None] & ~self.is_timestamp, NEG_INF)

        logits.masked_fill_(r.detect_language[:, None] & self.not_language, NEG_INF)
        return logits


def sample(logits: Tensor, temperatures: list[float], generators: list[torch.Generator | None]) -> tuple[Tensor, Tensor]:
    """Greedy where temperature is 0, else seeded sampling; returns (tokens, their log-probabilities)."""
    tokens = logits.argmax(dim=-1)
    for i, (t, gen) in enumerate(zip(temperatures, generators)):
        # Few rows ever sample (temperature fallback), so a per-row draw with the request's own
        # generator keeps results reproducible whatever else shares the batch.
        if t > 0:
            probs = torch.softmax(logits[i] / t, dim=-1)
            tokens[i] = torch.multinomial(probs.cpu(), 1, generator=gen).to(tokens.device)[0]
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs
