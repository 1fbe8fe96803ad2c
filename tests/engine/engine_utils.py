"""Shared helpers of the engine tests: batched submission, faster-whisper as the reference, a WER normalizer."""

from __future__ import annotations

import re
import time
import unicodedata
from dataclasses import dataclass

import numpy as np

from engine.request import DecodeOptions, TranscriptionResult
from tests.text_normalize import normalize_text

# Greedy, one window, no timestamps: the setting in which our tokens must equal faster-whisper's.
GREEDY = DecodeOptions(without_timestamps=True, temperatures=(0.0,))
WAIT_S = 600  # a hung request fails the test instead of blocking the run


@dataclass(frozen=True, slots=True)
class Reference:
    """faster-whisper's output for one clip."""

    tokens: list[int]
    text: str
    language: str
    language_probability: float


def submit_all(
    engine, audios: dict[str, np.ndarray], options: DecodeOptions = GREEDY
) -> dict[str, TranscriptionResult]:
    """Submits every clip before waiting on any, so the engine batches them."""
    handles = {name: engine.submit(audio, options) for name, audio in audios.items()}
    return {name: handle.wait(timeout=WAIT_S) for name, handle in handles.items()}


def settled_steps(engine) -> int:
    """The engine's step (launch) count once its last one has ended (a result is sent before the step counts
    itself)."""
    while True:
        steps = engine.num_steps
        time.sleep(0.05)
        if engine.num_steps == steps:
            return steps


def scores(result: TranscriptionResult) -> list[float]:
    """Each segment's average log-probability and no-speech probability (float sums: compared approximately)."""
    return [x for s in result.segments for x in (s.avg_logprob, s.no_speech_prob)]


def tokens_of(result: TranscriptionResult) -> list[int]:
    return [t for segment in result.segments for t in segment.tokens]


def faster_whisper_transcribe(model, audio: np.ndarray) -> Reference:
    """faster-whisper's greedy transcript, decoded the way the engine's GREEDY options decode."""
    segments, info = model.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False)
    segments = list(segments)
    tokens = [t for segment in segments for t in segment.tokens]
    text = "".join(segment.text for segment in segments).strip()
    return Reference(tokens, text, info.language, info.language_probability)


def first_difference(ours: list[int], theirs: list[int]) -> int:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


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
    """tests/text_normalize.py's rules (lowercase, no punctuation, single spaces), plus numbers and abbreviations
    spelled out and accents dropped, as LibriSpeech references write them."""
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 -> 1000
    text = re.sub(r"\d+", lambda m: f" {number_to_words(int(m.group()))} ", text)
    text = "".join(c for c in unicodedata.normalize("NFKD", normalize_text(text)) if not unicodedata.combining(c))
    return " ".join(_ABBREVIATIONS.get(word, word) for word in text.split())
