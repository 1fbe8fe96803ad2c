"""How a step's logits become tokens: the logit rules, the sampler and beam search.

A decoding feature is a rule (a LogitRule in a file of its own, registered in RULES below) or a search over rows.

- `rule.py`: `LogitRule`, the interface of one edit of the logits (admit a window, say which rows a step edits,
  build their inputs, apply), and what rules are built from (`RuleSetup`) and see of a step (`StepContext`)
- `processor.py`: `LogitsProcessor`, the registered rules over a batch, and their static form the multi-step
  graph replays
- `suppression.py`: the suppress list, begin-suppress, no end before a fixed token count
- `timestamps.py`: the timestamp rules (openai/whisper's ApplyTimestampRules) from a per-row state on the device
- `language.py`: a language pick among language tokens, and a request's languages
- `keywords.py`: `KeywordBias` (OpenAI's `keywords[]`) and its rule, `KeywordBonus`
- `sampling.py`: `Sampler`, greedy or seeded draws with each pick's log-probability
- `beam_search.py`: `BeamSearch` (admit, rank, advance) over `BeamGroup`s, a window's beams as rows of the batch

Imports: the model's tokenizer and the kernels; the sequences it is handed only as types.
"""

from __future__ import annotations

from engine.decoding.beam_search import BeamGroup, BeamSearch
from engine.decoding.keywords import KeywordBonus
from engine.decoding.language import LanguageDetection
from engine.decoding.processor import LogitsProcessor
from engine.decoding.rule import LogitRule, RuleSetup, StepContext
from engine.decoding.sampling import Sampler
from engine.decoding.suppression import FixedLength, SuppressBlank, SuppressTokens
from engine.decoding.timestamps import TimestampRules

# The logit rules, in the order they edit a step's logits: bonuses before the timestamp rules, which weigh text
# against timestamps.
RULES: tuple[type[LogitRule], ...] = (
    SuppressTokens,
    SuppressBlank,
    FixedLength,
    KeywordBonus,
    TimestampRules,
    LanguageDetection,
)


def logits_processor(setup: RuleSetup) -> LogitsProcessor:
    return LogitsProcessor([rule(setup) for rule in RULES])


__all__ = [
    "RULES",
    "BeamGroup",
    "BeamSearch",
    "LogitsProcessor",
    "RuleSetup",
    "StepContext",
    "logits_processor",
    "Sampler",
]
