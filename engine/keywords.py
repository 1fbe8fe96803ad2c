"""Contextual biasing toward keywords (OpenAI's `keywords[]`): a bonus on the logits of the tokens that begin a
keyword or continue one the text has begun.

Each keyword is a token sequence (as it follows a space, the way words come mid-sentence). After every sampled
token, the row's text so far is matched against the keywords' prefixes: wherever its last tokens are a keyword's
first n (one or more matches: a prefix tree of the keywords, walked from every suffix), that keyword's next token
gets CONTINUE_BONUS. The first token of a keyword gets START_BONUS only where the model already ranks it within
START_GATE of its best token: a keyword is begun where the audio is close to it (a bonus on a common first token
everywhere would put it everywhere), and finished once it is begun. A segment's timestamps end any match.
"""

from __future__ import annotations

# The bonuses and the gate: the settings of a sweep (tiny.en, `benchmarks/keywords.py`) that spelled the most
# keywords right without changing any word of the LibriSpeech clips decoded with unrelated keywords.
START_BONUS = 5.0  # logits, on the first token of each keyword the model ranks near its best
START_GATE = 6.0  # logits below the row's best within which a first token counts as near
CONTINUE_BONUS = 8.0  # logits, on the next token of a keyword the text has begun


class KeywordBias:
    def __init__(self, sequences: list[tuple[int, ...]], scale: float = 1.0):
        self.scale = scale
        self.next: dict[tuple[int, ...], set[int]] = {}  # a keyword prefix -> the tokens that continue it
        for seq in sequences:
            for i in range(len(seq)):
                self.next.setdefault(tuple(seq[:i]), set()).add(seq[i])
        self.longest = max((len(s) for s in sequences), default=0)

    def bonuses(self, tokens: list[int], text_end: int) -> dict[int, tuple[float, bool]]:
        """token -> (bonus, gated) for the next token after `tokens` (a window's sampled tokens), whose text tokens
        are those below `text_end` (the rest are timestamps and specials, which end a match). A gated bonus applies
        only near the row's best logit (START_GATE)."""
        out = dict.fromkeys(self.next.get((), ()), (START_BONUS * self.scale, True))
        tail: list[int] = []
        for token in reversed(tokens[-(self.longest - 1) :] if self.longest > 1 else []):
            if token >= text_end:
                break
            tail.insert(0, token)
        for n in range(1, len(tail) + 1):
            for token in self.next.get(tuple(tail[-n:]), ()):
                out[token] = (CONTINUE_BONUS * self.scale, False)
        return out
