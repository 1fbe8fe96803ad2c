"""Per-request options and results: what crosses the boundary between the engine and its callers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Whisper's published defaults (openai/whisper transcribe(), faster-whisper WhisperModel.transcribe).
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MAX_BEST_OF = 10  # samples per fallback attempt: each holds a slot while the attempt decodes
MAX_BEAM_SIZE = 10  # beams per window: each holds a slot while the window decodes


class Task(str, enum.Enum):
    TRANSCRIBE = "transcribe"
    TRANSLATE = "translate"


@dataclass(frozen=True, slots=True)
class ChunkingOptions:
    """Chunked mode: cut the audio at silences found by voice activity detection (OpenAI's `server_vad`)."""

    threshold: float = 0.5  # speech probability above which a 32 ms frame is speech
    prefix_padding_ms: int = 300  # audio kept on each side of a speech span
    silence_duration_ms: int = 500  # a pause at least this long ends a speech span

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.prefix_padding_ms < 0 or self.silence_duration_ms < 0:
            raise ValueError(
                f"prefix_padding_ms and silence_duration_ms must be >= 0, "
                f"got {self.prefix_padding_ms} and {self.silence_duration_ms}"
            )


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """Per-request decoding knobs (openai/whisper's DecodingOptions + transcribe() arguments)."""

    task: Task = Task.TRANSCRIBE
    language: str | None = None  # ISO-639-1 code; None detects it on multilingual models
    prompt: str | None = None  # becomes <|startofprev|> context (last 223 tokens)
    # The prompt's tokens, set by the engine's submit (in the caller's thread, not the engine loop's): only the last
    # n_text_ctx // 2 - 1 can ever be context, so a long prompt is cut to those before it reaches the loop.
    prompt_tokens: tuple[int, ...] | None = None
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    without_timestamps: bool = False  # True only for single-window, text-only decoding
    word_timestamps: bool = False
    condition_on_previous_text: bool = True
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    prompt_reset_on_temperature: float = 0.5
    # Each fallback attempt at a temperature above 0 draws this many samples, decoded side by side, and keeps the
    # likeliest (openai/whisper's best_of); the decode budget grows with it.
    best_of: int = 1
    # The attempt at temperature 0 searches this many beams (faster-whisper's beam_size, 5 there; 1: greedy). It
    # ends once round(beam_size * patience) hypotheses have finished, and ranks them by their summed
    # log-probability over length ** length_penalty (faster-whisper's definitions, which are CTranslate2's).
    beam_size: int = 1
    patience: float = 1.0
    length_penalty: float = 1.0
    # Seeds sampling at temperature > 0 so a result can be reproduced; None = the engine's EngineConfig.seed.
    seed: int | None = None
    # Tokens the request may sample (fallback retries included) per 30 s of audio before it fails with
    # DecodeBudgetExceededError; None = the engine's EngineConfig.decode_budget_per_window.
    decode_budget_per_window: int | None = None
    # Benchmarks only: every window decodes exactly this many tokens, <|endoftext|> ignored (vLLM's ignore_eos with
    # max_tokens), so runs on random weights do the same work as a peer told the same. Implies greedy decoding
    # without quality fallbacks (the engine's prepare sets that). Read by Sequence.must_not_end / ends_within. A
    # short context's window (context_margin_s) decodes one token fewer than its cap, if that is fewer.
    fixed_decode_tokens: int | None = None
    # Benchmarks only, instead: each window decodes this many tokens a second of its audio (rounded up), as speech
    # has, so that a preview of a few seconds costs what a real one does and a 30 s window what it does (a prefix's
    # tokens count toward the share: a partial continuing the words sent decodes only the rest).
    fixed_decode_tokens_per_s: float | None = None
    # Set: VAD cuts the audio into windows decoded in parallel (no previous-text conditioning across them).
    chunking: ChunkingOptions | None = None
    # A preview the caller can do without (the realtime API's partial decodes of a turn still being spoken): its
    # windows take a slot only when no other window waits for one, so they never delay a transcript.
    background: bool = False
    # Set: a window shorter than 30 s is encoded on a short context, its audio and this many seconds of the padding
    # (whisper.cpp's audio_ctx), and its decode attends to those positions only. Several times cheaper for a few
    # seconds of audio, and the text mostly the same but not always (benchmarks/partial_audio_ctx.py): for previews
    # such as the realtime API's partial decodes. None: Whisper's full 30 s window.
    context_margin_s: float | None = None
    # Text the first window's transcript is taken to begin with (openai/whisper's `prefix`): its tokens follow the
    # start of transcript as if decoded, and the result holds only what the decode adds after them. Text only
    # (without_timestamps). The realtime API's partial decodes pass the words a turn's previous ones agreed on, so
    # a refresh decodes the new words only. The engine's submit sets the tokens.
    prefix: str | None = None
    prefix_tokens: tuple[int, ...] | None = None
    # Keep each text token's log-probability in the segments (OpenAI's `include[]=logprobs`).
    logprobs: bool = False
    # Language detection picks among these ISO codes only (OpenAI's `languages[]`); None: any the model knows.
    languages: tuple[str, ...] | None = None
    # Words and phrases the decode is biased toward (OpenAI's `keywords[]`): a bonus on the logits of their tokens
    # (engine/decoding/keywords.py, scaled by `keyword_bias`; 0: none) and, with `keywords_in_prompt`, as a list in
    # every window's prompt too (faster-whisper's hotwords: more of the names come out right, and the text around
    # them can change where they are not spoken). The engine's submit sets the prompt's tokens (() for none).
    keywords: tuple[str, ...] = ()
    keyword_bias: float = 1.0
    keywords_in_prompt: bool = False
    keyword_prompt: tuple[int, ...] | None = None
    # The LoRA adapter the request decodes with (a name the engine has loaded); None: the base model.
    adapter: str | None = None

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise ValueError("temperatures must not be empty")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0, got {self.temperatures}")
        if not 1 <= self.best_of <= MAX_BEST_OF:
            raise ValueError(f"best_of must be between 1 and {MAX_BEST_OF}, got {self.best_of}")
        if not 1 <= self.beam_size <= MAX_BEAM_SIZE:
            raise ValueError(f"beam_size must be between 1 and {MAX_BEAM_SIZE}, got {self.beam_size}")
        if not 0 < self.patience <= MAX_BEAM_SIZE:
            raise ValueError(f"patience must be above 0 and at most {MAX_BEAM_SIZE}, got {self.patience}")
        if not 0 <= self.length_penalty <= 2:
            raise ValueError(f"length_penalty must be between 0 and 2, got {self.length_penalty}")
        if self.context_margin_s is not None and not 0 <= self.context_margin_s <= 30:
            raise ValueError(f"context_margin_s must be between 0 and 30, got {self.context_margin_s}")
        if self.prefix is not None and not self.without_timestamps:
            raise ValueError("a prefix needs without_timestamps (the timestamp rules would follow it with one)")
        if self.fixed_decode_tokens is not None and self.fixed_decode_tokens < 1:
            raise ValueError(f"fixed_decode_tokens must be >= 1, got {self.fixed_decode_tokens}")
        if self.fixed_decode_tokens_per_s is not None:
            if self.fixed_decode_tokens is not None:
                raise ValueError("fixed_decode_tokens and fixed_decode_tokens_per_s exclude each other")
            if not 0 < self.fixed_decode_tokens_per_s <= 100:
                raise ValueError(f"fixed_decode_tokens_per_s must be above 0 and at most 100, got "
                                 f"{self.fixed_decode_tokens_per_s}")  # fmt: skip

    @property
    def fixes_tokens(self) -> bool:
        """Whether windows decode a fixed number of tokens (benchmarks)."""
        return self.fixed_decode_tokens is not None or self.fixed_decode_tokens_per_s is not None


@dataclass(slots=True)
class Word:
    word: str
    start: float
    end: float
    probability: float


@dataclass(slots=True)
class TokenLogprob:
    """One text token of a transcript and its log-probability, in the shape of OpenAI's logprobs items."""

    token: str
    bytes: bytes  # the token's own bytes (a token can hold part of a UTF-8 character)
    logprob: float


@dataclass(slots=True)
class Segment:
    """One timestamped piece of a transcript, in OpenAI's verbose_json segment fields."""

    id: int
    seek: int  # window start, in mel frames (openai/whisper's convention)
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None = None
    logprobs: list[TokenLogprob] | None = None  # its text tokens', when DecodeOptions.logprobs asks for them


@dataclass(slots=True)
class TranscriptionResult:
    text: str
    segments: list[Segment]
    language: str  # ISO code
    duration: float  # seconds of input audio
    num_tokens: int = 0
    # seconds from submission to the first decoded token (queueing + features + encoder + prompt); None when
    # nothing was decoded (empty audio, every window skipped by VAD)
    time_to_first_token: float | None = None


@dataclass(slots=True)
class SegmentEvent:
    """Streamed from the engine as each window's segments become final."""

    segments: list[Segment]


class EngineError(Exception):
    """Base class for errors the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request cannot be served as asked (e.g. a non-English language on an English-only model)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class DecodeBudgetExceededError(InvalidRequestError):
    """The request sampled more tokens than its budget allows (its windows kept falling back): it is ended
    rather than left to occupy the engine."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; the caller should retry later."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineInternalError(EngineError):
    """Serving this request failed unexpectedly (the reason is in the engine's log, not in this message)."""


class EngineDeadError(EngineError):
    """The engine loop has stopped; nothing more will be served. `unstarted`: the request's first window had not
    reached a slot, so nothing of it ran (another engine may take it: it cannot be what killed this one)."""

    def __init__(self, message: str, unstarted: bool = False):
        super().__init__(message)
        self.unstarted = unstarted


class RequestAbortedError(EngineError):
    """The request was aborted (client disconnected or engine shut down)."""


@dataclass(slots=True)
class EngineStats:
    num_waiting: int = 0
    num_running: int = 0
    num_slots: int = 0
    batch_invariant: bool = False  # the GPU's batch-invariant kernels run (KernelOptions.batch_invariant)
    extra: dict[str, float] = field(default_factory=dict)
