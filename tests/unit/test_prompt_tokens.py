"""A prompt's context tokens: the last 223 (Whisper's and OpenAI's rule), found by tokenizing only its tail."""

from __future__ import annotations

import csv
import time

import pytest

from engine.model.tokenizer import Tokenizer
from engine.model.weights import resolve_model
from engine.transcription.sequential import prompt_tokens

N_TEXT_CTX = 448
KEEP = N_TEXT_CTX // 2 - 1


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    resolved = resolve_model("tiny.en")
    return Tokenizer.from_file(resolved.config_dir / "tokenizer.json", 0, False)


@pytest.fixture(scope="module")
def reference_text(data_dir) -> str:
    with open(data_dir / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return " ".join(row["reference_text"] for row in rows if row["language"] == "en")


def whole(tokenizer: Tokenizer, prompt: str) -> list[int]:
    return tokenizer.encode(" " + prompt.strip())[-KEEP:]


def test_short_prompts_are_tokenized_whole(tokenizer):
    for prompt in ("President Kennedy's inaugural address.", "  spaces around  ", "Ünïcödé, 東京, ♪"):
        assert prompt_tokens(tokenizer, prompt, N_TEXT_CTX) == whole(tokenizer, prompt)
    assert prompt_tokens(tokenizer, None, N_TEXT_CTX) == prompt_tokens(tokenizer, "   ", N_TEXT_CTX) == []


def test_a_long_prompt_keeps_exactly_the_last_223_tokens(tokenizer, reference_text):
    for length in (5_000, 50_000, 1_000_000):
        prompt = (reference_text * (1 + length // len(reference_text)))[-length:]
        got = prompt_tokens(tokenizer, prompt, N_TEXT_CTX)
        assert len(got) == KEEP
        assert got == whole(tokenizer, prompt), length


def test_a_megabyte_prompt_costs_what_a_page_does(tokenizer, reference_text):
    prompt = (reference_text * (1 + 1_000_000 // len(reference_text)))[:1_000_000]
    start = time.perf_counter()
    prompt_tokens(tokenizer, prompt, N_TEXT_CTX)
    tail_s = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer.encode(prompt)
    whole_s = time.perf_counter() - start
    assert tail_s < whole_s / 20, (tail_s, whole_s)


def test_no_space_and_broken_unicode_prompts_are_bounded(tokenizer):
    assert len(prompt_tokens(tokenizer, "x" * 1_000_000, N_TEXT_CTX)) <= KEEP
    assert prompt_tokens(tokenizer, "a\udcffb", N_TEXT_CTX)  # a lone surrogate cannot crash the tokenizer
