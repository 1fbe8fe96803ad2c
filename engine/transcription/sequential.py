"""Transcription: one request's long-form state (seek, previous text, temperature fallback, segments)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.audio.constants import CHUNK_LENGTH, FRAMES_PER_SECOND, N_FRAMES
from engine.audio.features import pad_or_trim
from engine.model.tokenizer import Tokenizer
from engine.request import (
    DecodeBudgetExceededError,
    DecodeOptions,
    Segment,
    SegmentEvent,
    Task,
    TokenLogprob,
    TranscriptionResult,
)
from engine.runtime.sequence import Sequence, WindowJob
from engine.transcription.alignment import AlignmentInput, add_word_timestamps, find_alignment
from engine.transcription.segments import FRAME_SECONDS, RawSegment, compression_ratio, split_by_timestamps

# A short context's decode (DecodeOptions.context_margin_s) may sample SHORT_CONTEXT_TOKENS and as many per second
# of its audio: fast speech is some 6 tokens a second with its timestamps. A decode that reaches the cap is
# repeating itself (tiny.en on a second of speech: "God, God, God, ..."): its window gives no text, as a preview
# that a later one replaces had better, and the repetition costs a few tokens, not the context's 448.
SHORT_CONTEXT_TOKENS, SHORT_CONTEXT_TOKENS_PER_S = 10, 8
# Less audio than SHORT_CONTEXT_MIN_S gets a context of SHORT_CONTEXT_FLOOR_S: with a 3 s margin tiny.en heard 56-78%
# of the words a full window hears in the first 0.75-1.5 s of speech (a repetition, or nothing, in a third of the
# decodes), 90-96% from 2 s on (benchmarks/partial_audio_ctx.py --cuts). On 10 s (500 positions, a third of a full
# window's encoder, a length GPUs tile a slot with) it gives 84% of a full window's words in 26 English clips cut at
# 0.75-1.75 s, in 0.34x its time (`--clips "g1_en_*"`); a realtime turn's first delta then comes 0.2-0.5 s sooner
# on a CPU, with as many of its live words changed by the final at the default delay, more at `low` (BENCHMARKS.md,
# realtime).
SHORT_CONTEXT_MIN_S = 2.0
SHORT_CONTEXT_FLOOR_S = 10.0


@dataclass(slots=True)
class WindowResult:
    tokens: list[int]
    logprobs: list[float]  # each token's
    sum_logprob: float  # the tokens' and the end's
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    alignment: AlignmentInput | None = None


class Transcription:
    """Runs Whisper's sequential algorithm for one request, one window at a time, inside the shared batch."""

    def __init__(
        self,
        request_id: str,
        mel: Tensor,
        duration: float,
        options: DecodeOptions,
        tokenizer: Tokenizer,
        n_text_ctx: int,
        emit: Callable[[object], None],
    ):
        self.request_id = request_id
        self.mel = mel  # (n_mels, frames) of the whole audio
        self.content_frames = mel.shape[-1] - 1  # the last STFT frame is padding
        self.duration = duration
        self.options = options
        self.tokenizer = tokenizer
        self.n_text_ctx = n_text_ctx
        self.emit = emit
        self.language = options.language if tokenizer.is_multilingual else "en"
        self.seek = 0
        if options.prompt_tokens is not None:
            self.initial_tokens = list(options.prompt_tokens)
        else:
            self.initial_tokens = prompt_tokens(tokenizer, options.prompt, n_text_ctx)
        self.all_tokens = list(self.initial_tokens)
        self.prompt_reset_since = 0
        self.last_speech = 0.0  # end of the last word so far (word-timestamp heuristics)
        self.segments: list[Segment] = []
        self.attempts: list[WindowResult] = []  # this window's decodes so far, one per temperature
        self.samples: list[WindowResult] = []  # the current attempt's best_of samples decoded so far
        self.candidate_generators: list[torch.Generator] = []  # one per sample while an attempt draws best_of
        self.aborted = False
        self.done = False
        self.submitted_at = time.perf_counter()  # the engine sets the time its caller submitted the request
        self.first_token_at: float | None = None
        self._generator: torch.Generator | None = None
        self.seed = options.seed  # the sampling generator's (a chunked request's windows each get their own)
        per_window = options.decode_budget_per_window
        if per_window is not None and options.keyword_prompt:
            per_window *= 2  # room for the retry without keywords of a window that they derailed (_window_job)
        if per_window is not None:
            per_window *= options.best_of  # each fallback attempt draws best_of samples
        self.token_budget = None if per_window is None else per_window * max(1, math.ceil(duration / CHUNK_LENGTH))
        self.tokens_sampled = 0  # every attempt's, EOT included

    @property
    def generator(self) -> torch.Generator:
        """Per-request sampling generator, seeded so a fallback decode can be reproduced."""
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed)
        return self._generator

    def generator_for(self, candidate: int) -> torch.Generator:
        """The generator a window's sampling draws from: the request's (its windows decode one after another,
        so the draws come in one order); each of best_of samples decoded side by side has its own."""
        if self.candidate_generators:
            return self.candidate_generators[candidate]
        return self.generator

    @property
    def segment_size(self) -> int:
        return min(N_FRAMES, self.content_frames - self.seek)

    def start_jobs(self) -> list[WindowJob]:
        """The windows to queue when the request arrives: sequential decoding starts with the first only."""
        return self.next_jobs()

    def next_jobs(self) -> list[WindowJob]:
        """The decodes of the current window at the next temperature (best_of samples above 0), or none when the
        audio is done."""
        if self.seek >= self.content_frames or self.aborted:
            return []
        window = self.mel[:, self.seek : self.seek + self.segment_size]
        previous = self.all_tokens[self.prompt_reset_since :]
        temperature = self.options.temperatures[len(self.attempts)]
        n = self.options.best_of if temperature > 0 else 1
        self.candidate_generators = [
            torch.Generator().manual_seed(candidate_seed(self.seed, self.seek, len(self.attempts), i)) for i in range(n)
        ] if n > 1 else []  # fmt: skip
        return [self._window_job(window, previous, self.language, temperature, candidate=i) for i in range(n)]

    def _window_job(
        self, window: Tensor, previous: list[int], language: str | None, temperature: float, index: int = 0,
        candidate: int = 0,
    ) -> WindowJob:  # fmt: skip
        """A decode of `window` (mel frames), conditioned on `previous` text; language None detects it."""
        tok, opts = self.tokenizer, self.options
        prompt: list[int] = []
        # keywords lead the prompt of a window's first decode only: a window that fails the quality checks with
        # them (a list of names the audio does not hold can derail it) is retried without
        keywords = list(opts.keyword_prompt or ()) if temperature == opts.temperatures[0] else []
        if previous or keywords:
            # Whisper conditions on at most half the context of previous text; keywords come first
            room = self.n_text_ctx // 2 - 1 - len(keywords)
            prompt = [tok.sot_prev] + keywords + (previous[-room:] if room > 0 and previous else [])
        tail = [] if not opts.without_timestamps else [tok.no_timestamps]
        detect = language is None
        if detect:
            prompt += [tok.sot]
            forced = [tok.task_token(opts.task.value)] + tail
        else:
            prompt += tok.sot_sequence(language, opts.task.value) + tail
            forced = []
        prefix = list(opts.prefix_tokens or ()) if self.seek == 0 else []
        if prefix:  # the first window's text begins with them, as if decoded
            if detect:
                forced += prefix
            else:
                prompt += prefix
        frames = self._context_frames(window.shape[-1])
        max_tokens = None if frames == N_FRAMES else self._short_context_tokens(window.shape[-1])
        return WindowJob(
            request_id=self.request_id,
            mel=pad_or_trim(window, frames),
            prompt=prompt,
            temperature=temperature,
            detect_language=detect,
            forced_after_language=forced,
            with_timestamps=not opts.without_timestamps,
            fixed_decode_tokens=self._fixed_tokens(window.shape[-1], max_tokens, len(prefix)),
            window_index=index,
            word_timestamps=opts.word_timestamps,
            num_frames=window.shape[-1],
            options=opts,
            candidate=candidate,
            beam_size=opts.beam_size if temperature == 0 else 1,
            background=opts.background,
            generator=self.generator_for(candidate) if temperature > 0 else None,
            max_tokens=max_tokens,
        )

    def _fixed_tokens(self, frames: int, max_tokens: int | None, prefix: int = 0) -> int | None:
        """The tokens a window of `frames` mel frames of audio decodes when benchmarks fix them; a short context's
        stop one short of its cap, which would take them for a repetition and give no text. Per second of audio,
        a prefix's `prefix` tokens count toward the audio's share: a real decode after a prefix (a realtime partial
        continuing the words sent) writes only the text of the audio that the prefix does not cover."""
        opts = self.options
        fixed = opts.fixed_decode_tokens
        if opts.fixed_decode_tokens_per_s is not None:
            fixed = max(1, math.ceil(opts.fixed_decode_tokens_per_s * frames / FRAMES_PER_SECOND) - prefix)
        if fixed is not None and max_tokens is not None:
            fixed = min(fixed, max_tokens - 1)
        return fixed

    def _context_frames(self, frames: int) -> int:
        """The mel frames a window of `frames` frames of audio is encoded on: N_FRAMES, or with a short context
        (DecodeOptions.context_margin_s) the audio and the margin, at least SHORT_CONTEXT_FLOOR_S under
        SHORT_CONTEXT_MIN_S of audio, an even count (the encoder halves it)."""
        margin = self.options.context_margin_s
        if margin is None:
            return N_FRAMES
        context = frames + margin * FRAMES_PER_SECOND
        if frames < SHORT_CONTEXT_MIN_S * FRAMES_PER_SECOND:
            context = max(context, SHORT_CONTEXT_FLOOR_S * FRAMES_PER_SECOND)
        return min(N_FRAMES, 2 * math.ceil(context / 2))

    @staticmethod
    def _short_context_tokens(frames: int) -> int:
        """The cap on a short context's tokens for `frames` mel frames of audio."""
        return SHORT_CONTEXT_TOKENS + math.ceil(SHORT_CONTEXT_TOKENS_PER_S * frames / FRAMES_PER_SECOND)

    def on_window_done(self, seq: Sequence) -> list[WindowJob]:
        """Judge a finished window: retry at a higher temperature, move on, or finish the request. Of an attempt's
        best_of samples, the likeliest (the mean log-probability of its tokens, as openai/whisper ranks them) is
        the attempt, once all are in."""
        if seq.language is not None and self.language is None:
            self.language = seq.language
        result = self._window_result(seq)
        self.tokens_sampled += len(seq.tokens) + 1
        if self.candidate_generators:
            self.samples.append(result)
            if len(self.samples) < len(self.candidate_generators):
                return []  # the others are still decoding
            result = max(self.samples, key=lambda r: r.sum_logprob / max(1, len(r.tokens)))
            self.samples, self.candidate_generators = [], []
        self.attempts.append(result)
        if self._needs_fallback(result) and len(self.attempts) < len(self.options.temperatures):
            if not self._budget_spent():
                return self.next_jobs()
            self._blame_the_prompt()
            # nothing the caller sent is to blame (noise, say): the window keeps the best of its attempts so far,
            # as when every temperature fails, and no window falls back again (one decode each: still bounded)
        self._accept(self._best_attempt(self.attempts))
        self.attempts = []
        jobs = self.next_jobs()
        if not jobs:
            self.finish()
        return self._within_budget(jobs)

    def _budget_spent(self) -> bool:
        return self.token_budget is not None and self.tokens_sampled >= self.token_budget

    def _within_budget(self, jobs: list[WindowJob]) -> list[WindowJob]:
        """The next window's decodes; once the budget is spent, a request whose prompt derails it fails."""
        if jobs and self._budget_spent():
            self._blame_the_prompt()
        return jobs

    def _blame_the_prompt(self) -> None:
        """A request that sent a prompt (or keywords in the prompt) and has sampled its budget ends here: its
        windows kept failing Whisper's quality checks, which a prompt unrelated to the audio causes."""
        if not (self.options.prompt or self.options.prompt_tokens or self.options.keyword_prompt):
            return
        raise DecodeBudgetExceededError(
            f"Decoding was stopped after {self.tokens_sampled} tokens, the budget for {self.duration:.0f} s of "
            f"audio ({self.token_budget}): its windows kept failing Whisper's quality checks and falling back to "
            "higher temperatures, which a prompt unrelated to the audio causes; try without the prompt.",
            "prompt",
        )

    def _window_result(self, seq: Sequence) -> WindowResult:
        tokens, logprobs = seq.tokens, seq.logprobs
        if seq.capped:
            tokens, logprobs = [], []  # a short context's repetition (SHORT_CONTEXT_TOKENS_PER_S)
        text = self.tokenizer.decode(tokens).strip()
        return WindowResult(
            tokens=tokens,
            logprobs=logprobs,
            sum_logprob=seq.sum_logprob,
            avg_logprob=seq.sum_logprob / (len(tokens) + 1),
            compression_ratio=compression_ratio(text),
            no_speech_prob=seq.no_speech_prob,
            temperature=seq.job.temperature,
            alignment=seq.alignment,
        )

    def _kept_pieces(self, tokens: list[int], segment_size: int) -> tuple[list[RawSegment], int]:
        """The window's segments that become part of the transcript (not instantaneous, not empty)."""
        raw, next_seek = split_by_timestamps(tokens, self.tokenizer.timestamp_begin, self.seek, segment_size)
        kept = [p for p in raw if p.start != p.end and self.tokenizer.decode(p.tokens).strip()]
        return kept, next_seek

    def tokens_to_align(self, seq: Sequence) -> list[int]:
        """Text tokens whose words get timestamps: those of the segments this window would keep."""
        kept, _ = self._kept_pieces(seq.tokens, self.segment_size)
        return [t for p in kept for t in p.tokens if t < self.tokenizer.eot]

    def _needs_fallback(self, r: WindowResult) -> bool:
        o = self.options
        too_repetitive = o.compression_ratio_threshold is not None and r.compression_ratio > o.compression_ratio_threshold
        too_unlikely = o.log_prob_threshold is not None and r.avg_logprob < o.log_prob_threshold
        silent = o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold and too_unlikely
        return (too_repetitive or too_unlikely) and not silent

    def _best_attempt(self, attempts: list[WindowResult]) -> WindowResult:
        """The decode to keep from one window's attempts, one per temperature tried."""
        last = attempts[-1]
        if len(attempts) == 1 or not self._needs_fallback(last):
            return last
        # every temperature failed: take the likeliest decode that was not too repetitive
        threshold = self.options.compression_ratio_threshold
        ok = [a for a in attempts if threshold is None or a.compression_ratio <= threshold]
        best = max(ok or attempts, key=lambda a: a.avg_logprob)
        best.temperature = last.temperature  # the prompt-reset rule looks at the last temperature tried
        return best

    def _is_silence(self, r: WindowResult) -> bool:
        o = self.options
        if o.no_speech_threshold is None or r.no_speech_prob <= o.no_speech_threshold:
            return False
        return o.log_prob_threshold is None or r.avg_logprob <= o.log_prob_threshold

    def _accept(self, r: WindowResult) -> None:
        o, tok = self.options, self.tokenizer
        segment_size = self.segment_size
        if self._is_silence(r):
            self.seek += segment_size  # silence: skip the window
            return
        kept, next_seek = self._kept_pieces(r.tokens, segment_size)
        if o.fixes_tokens:
            next_seek = self.seek + segment_size  # benchmarks: one window per 30 s, whatever tokens came out
        new: list[Segment] = []
        for piece in kept:
            self.all_tokens.extend(piece.tokens)
            segment_id = len(self.segments) + len(new)
            text = tok.decode(piece.tokens)
            segment = self._segment(segment_id, self.seek, piece.start, piece.end, text, piece.tokens, r)
            if o.logprobs:
                segment.logprobs = self._token_logprobs(piece.tokens, r.logprobs[piece.first :])
            new.append(segment)
        if o.word_timestamps and new and r.alignment is not None:
            timings = find_alignment(tok, r.alignment)
            self.last_speech = add_word_timestamps(new, timings, tok.eot, self.time_offset, self.last_speech)
            single_ending = len(r.tokens) >= 2 and r.tokens[-2] < tok.timestamp_begin <= r.tokens[-1]
            last_word_end = next((s.words[-1].end for s in reversed(new) if s.words), None)
            if not single_ending and last_word_end is not None and last_word_end > self.time_offset:
                # resume right after the last word, which is sharper than the last timestamp token
                next_seek = round(last_word_end * FRAMES_PER_SECOND)
        if not o.condition_on_previous_text or r.temperature > o.prompt_reset_on_temperature:
            self.prompt_reset_since = len(self.all_tokens)
        self.seek = max(next_seek, self.seek + 1)  # always make progress
        self.segments.extend(new)
        if new:
            self.emit(SegmentEvent(new))

    def _segment(
        self, id: int, seek: int, start: float, end: float, text: str, tokens: list[int], r: WindowResult
    ) -> Segment:
        """A segment of the transcript, its times (seconds) clamped to the audio."""
        end = min(end, self.duration)
        return Segment(
            id=id,
            seek=seek,
            start=round(min(start, end), 3),
            end=round(end, 3),
            text=text,
            tokens=tokens,
            temperature=r.temperature,
            avg_logprob=r.avg_logprob,
            compression_ratio=r.compression_ratio,
            no_speech_prob=r.no_speech_prob,
        )

    def _token_logprobs(self, tokens: list[int], logprobs: list[float]) -> list[TokenLogprob]:
        tok = self.tokenizer
        out = []
        for token, logprob in zip(tokens, logprobs):
            if token < tok.eot:
                raw = tok.token_bytes(token)
                out.append(TokenLogprob(raw.decode("utf-8", "replace"), raw, logprob))
        return out

    def finish(self) -> None:
        self.done = True
        text = "".join(s.text for s in self.segments).strip()
        num_tokens = sum(len(s.tokens) for s in self.segments)
        language = self.language or "en"
        ttft = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        self.emit(TranscriptionResult(text, self.segments, language, self.duration, num_tokens, ttft))

    @property
    def time_offset(self) -> float:
        return self.seek * FRAME_SECONDS

    @property
    def task(self) -> Task:
        return self.options.task


def prompt_tokens(tokenizer: Tokenizer, prompt: str | None, n_text_ctx: int) -> list[int]:
    """The prompt's tokens that can be context: Whisper keeps the last n_text_ctx // 2 - 1 (OpenAI documents the
    same for `prompt`). Only the prompt's tail is tokenized, so a megabyte of prompt costs what a page does."""
    text = prompt.strip() if prompt else ""
    if not text:
        return []
    keep = n_text_ctx // 2 - 1
    tail_chars = PROMPT_CHARS_PER_TOKEN * keep
    if len(text) > tail_chars:
        tail = text[-tail_chars:]
        cut = tail.find(" ")  # start at a word, as the whole prompt's tokenization would
        text = tail[cut:] if cut >= 0 else tail
    else:
        text = " " + text
    # lone surrogates (from a client's broken escapes) cannot be tokenized: they become U+FFFD
    text = text.encode("utf-8", "replace").decode("utf-8")
    return tokenizer.encode(text)[-keep:]


# Characters of a prompt's tail tokenized: far more than 223 tokens of any language's text take.
PROMPT_CHARS_PER_TOKEN = 32


def candidate_seed(seed: int | None, seek: int, attempt: int, candidate: int) -> int:
    """The seed of one of an attempt's best_of samples: fixed by the request's seed and where the sample is, whatever
    order the samples run in."""
    return hash((seed or 0, seek, attempt, candidate)) % 2**63  # a tuple of ints hashes the same in every process
