"""Word timestamps: alignment-head cross-attention, median filter and DTW (the method of openai/whisper)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from engine.audio.constants import TOKENS_PER_SECOND
from engine.model.tokenizer import Tokenizer
from engine.request import Segment, Word

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MEDIAN_FILTER_WIDTH = 7


@dataclass(slots=True)
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


@dataclass(slots=True)
class AlignmentInput:
    """What the engine hands over once a window's tokens are final."""

    text_tokens: list[int]
    cross_qk: Tensor  # (alignment heads, len(prompt) + len(text_tokens) + 1, n_audio_ctx), pre-softmax
    token_probs: list[float] = field(default_factory=list)  # probability of each text token
    num_frames: int = 3000  # mel frames of real audio in the window
    num_prompt: int = 0  # rows of cross_qk before the first text token
    language: str | None = None  # space-less scripts are split into words by characters


def median_filter(x: Tensor, width: int) -> Tensor:
    """Median over the last dimension with reflect padding; x : (..., n)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    shape = x.shape
    padded = F.pad(x.reshape(-1, 1, shape[-1]), (pad, pad), mode="reflect")
    return padded.unfold(-1, width, 1).sort(dim=-1).values[..., pad].reshape(shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Monotonic alignment of rows (tokens) to columns (frames), minimising the summed cost.

    Cells on one anti-diagonal depend only on the two before it, so each diagonal is one vector step."""
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    acc[0, 0] = 0.0
    for k in range(2, n + m + 1):
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        c0, c1, c2 = acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1]
        # same tie-breaking as openai/whisper: diagonal, then up, else left
        choice = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(choice, [c0, c1, c2])
        acc[i, j] = cost[i - 1, j - 1] + best
        trace[i, j] = choice
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    result = np.array(path[1:] if path and path[0] == (-1, -1) else path)
    return result[:, 0], result[:, 1]


def find_alignment(tokenizer: Tokenizer, a: AlignmentInput) -> list[WordTiming]:
    if not a.text_tokens:
        return []
    weights = a.cross_qk[:, :, : a.num_frames // 2].float().softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std, MEDIAN_FILTER_WIDTH)
    matrix = weights.mean(dim=0)[a.num_prompt : -1]  # text tokens only: not the prompt, not EOT
    text_indices, time_indices = dtw(-matrix.double().cpu().numpy())

    words, word_tokens = tokenizer.split_to_word_tokens(a.text_tokens + [tokenizer.eot], a.language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    probs = a.token_probs or [0.0] * len(a.text_tokens)
    return [
        WordTiming(word, toks, float(s), float(e), float(np.mean(probs[i:j])) if j > i else 0.0)
        for word, toks, s, e, i, j in zip(words, word_tokens, starts, ends, boundaries[:-1], boundaries[1:])
    ]


def merge_punctuations(alignment: list[WordTiming]) -> None:
    """Attach opening punctuation to the next word and closing punctuation to the previous one."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        prev, nxt = alignment[i], alignment[j]
        if prev.word.startswith(" ") and prev.word.strip() in PREPEND_PUNCTUATIONS:
            nxt.word, nxt.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        prev, nxt = alignment[i], alignment[j]
        if not prev.word.endswith(" ") and nxt.word in APPEND_PUNCTUATIONS:
            prev.word, prev.tokens = prev.word + nxt.word, prev.tokens + nxt.tokens
            nxt.word, nxt.tokens = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(
    segments: list[Segment], alignment: list[WordTiming], eot: int, time_offset: float, last_speech: float
) -> float:
    """Give each segment its words (times in the whole audio); returns the end of the last speech."""
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    # long words at sentence boundaries are usually a pause the model folded into them
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)

    index = 0
    for seg in segments:
        n_text = sum(1 for t in seg.tokens if t < eot)
        taken, words = 0, []
        while index < len(alignment) and taken < n_text:
            timing = alignment[index]
            if timing.word:
                words.append(
                    Word(timing.word, round(time_offset + timing.start, 2), round(time_offset + timing.end, 2),
                         round(timing.probability, 4))
                )  # fmt: skip
            taken += len(timing.tokens)
            index += 1
        if words:
            _adjust_edges(seg, words, median, longest, last_speech)
            last_speech = seg.end
        seg.words = words
    return last_speech


def _adjust_edges(seg: Segment, words: list[Word], median: float, longest: float, last_speech: float) -> None:
    """openai/whisper's boundary heuristics, then keep every word inside its segment."""
    first = words[0]
    if first.end - last_speech > median * 4 and (
        first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - longest)
    if seg.start < first.end and seg.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, seg.start))
    else:
        seg.start = first.start
    last = words[-1]
    if seg.end > last.start and seg.end + 0.5 < last.end:
        last.end = max(last.start + median, seg.end)
    else:
        seg.end = last.end
    for w in words:
        w.start = min(max(w.start, seg.start), seg.end)
        w.end = min(max(w.end, w.start), seg.end)
