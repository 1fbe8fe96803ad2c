"""One text normalizer for WER: lowercase, no punctuation, single spaces.

Apostrophes are dropped inside words ("beauty's" -> "beautys"); every other punctuation or symbol character
becomes a space, so that hyphenated and dash-joined words split the same way in every transcript.
"""

from __future__ import annotations

import re
import unicodedata

_APOSTROPHES = re.compile(r"['\u2018\u2019\u02bc`]")


def normalize_text(text: str) -> str:
    text = _APOSTROPHES.sub("", unicodedata.normalize("NFKC", text).lower())
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    return " ".join(text.split())
