"""Comparing transcripts: the JFK clip and its words, loose word matching, and the text normalizers for WER.

normalize_text is the one normalizer for WER: lowercase, no punctuation, single spaces. Apostrophes are dropped
inside words ("beauty's" -> "beautys"); every other punctuation or symbol character becomes a space, so that
hyphenated and dash-joined words split the same way in every transcript. normalize_english adds what LibriSpeech
references need on top (numbers and abbreviations spelled out, accents dropped).
"""

from __future__ import annotations

import re
import unicodedata

JFK = "g1_en_jfk.flac"
COMMON_ENGLISH = {
    "the",
    "a",
    "an",
    "is",
    "are",
    "and",
    "of",
    "to",
    "in",
    "it",
    "i",
    "you",
    "that",
    "this",
    "we",
    "for",
    "on",
    "with",
    "be",
    "was",
    "my",
    "not",
    "have",
    "what",
    "your",
    "our",
}


def words(text: str) -> list[str]:
    """Lowercase words without punctuation, for comparing transcripts loosely."""
    return re.findall(r"[a-z0-9']+", text.lower())


JFK_WORDS = words("ask not what your country can do for you ask what you can do for your country")


def contains_words(text: str, expected: list[str]) -> bool:
    """True when `expected` appears as a contiguous run of words in `text`."""
    got = words(text)
    n = len(expected)
    return any(got[i : i + n] == expected for i in range(len(got) - n + 1))


def word_errors_within(text: str, expected: list[str]) -> int:
    """The fewest word substitutions, insertions and deletions that turn some contiguous run of `text`'s words into
    `expected` (an edit distance where the run may start and end anywhere)."""
    got = words(text)
    previous = list(range(len(expected) + 1))  # against the empty run: every expected word deleted
    best = previous[-1]
    for word in got:
        row = [0]  # a run may start at any word
        for j, want in enumerate(expected, start=1):
            row.append(min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (word != want)))
        best = min(best, row[-1])
        previous = row
    return best


_APOSTROPHES = re.compile(r"['\u2018\u2019\u02bc`]")


def normalize_text(text: str) -> str:
    text = _APOSTROPHES.sub("", unicodedata.normalize("NFKC", text).lower())
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    return " ".join(text.split())


# For WER, a small stand-in for Whisper's EnglishTextNormalizer (its normalizer.json is not available offline).

_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
)  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint", "vs": "versus"}


def number_to_words(n: int) -> str:
    """Cardinal words for 0..999,999 ("one hundred twenty three"); bigger numbers stay digits."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_to_words(n % 100))
    if n < 1_000_000:
        return number_to_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + number_to_words(n % 1000))
    return str(n)


def normalize_english(text: str) -> str:
    """normalize_text's rules (lowercase, no punctuation, single spaces), plus numbers and abbreviations spelled
    out and accents dropped, as LibriSpeech references write them."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 -> 1000
    text = re.sub(r"\d+", lambda m: f" {number_to_words(int(m.group()))} ", text)
    text = "".join(c for c in unicodedata.normalize("NFKD", normalize_text(text)) if not unicodedata.combining(c))
    return " ".join(_ABBREVIATIONS.get(word, word) for word in text.split())
