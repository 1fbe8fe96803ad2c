"""Wire models: validated request forms and OpenAI's response types (reused from `openai.types`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from openai.types import Model
from openai.types.audio import (
    Transcription,
    TranscriptionSegment,
    TranscriptionVerbose,
    Translation,
    TranslationVerbose,
)
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import CompletionUsage
from pydantic import BaseModel, ConfigDict, Field

from engine import MAX_BEAM_SIZE, MAX_BEST_OF, MAX_SPEAKERS, ChunkingOptions, SpeakerCount, Task

from .response_format import ResponseFormat

__all__ = [
    "ChatCompletion",
    "ChatCompletionMessage",
    "ChatCompletionRequest",
    "Choice",
    "CompletionUsage",
    "DurationUsage",
    "Model",
    "ModelList",
    "ResponseFormat",
    "TranscriptionForm",
    "TranscriptionJSON",
    "TranscriptionParams",
    "TranscriptionSegment",
    "TranscriptionVerboseJSON",
    "TranslationForm",
    "TranslationJSON",
    "TranslationVerboseJSON",
    "Upload",
]


class TranslationForm(BaseModel):
    """`POST /v1/audio/translations` fields other than `file`, as the SDK puts them on the wire."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    model: str
    prompt: str | None = None
    response_format: str = "json"  # checked by hand so that unsupported values get their own message
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
    stream: bool = False
    # Extensions (not OpenAI's): Whisper's decoding knobs, as faster-whisper and openai/whisper name them
    best_of: int | None = Field(default=None, ge=1, le=MAX_BEST_OF)
    beam_size: int | None = Field(default=None, ge=1, le=MAX_BEAM_SIZE)
    patience: float | None = Field(default=None, gt=0, le=MAX_BEAM_SIZE)
    length_penalty: float | None = Field(default=None, ge=0, le=2)


class TranscriptionForm(TranslationForm):
    """`POST /v1/audio/transcriptions` fields other than `file`; bracketed names are the SDK's list encoding."""

    language: str | None = None
    timestamp_granularities: list[str] | None = Field(default=None, alias="timestamp_granularities[]")
    include: list[str] | None = Field(default=None, alias="include[]")
    chunking_strategy: str | dict[str, str] | None = None
    # diarized_json's known speakers: names, and data URLs of 2-10 s of each one's voice
    known_speaker_names: list[str] | None = Field(default=None, alias="known_speaker_names[]")
    known_speaker_references: list[str] | None = Field(default=None, alias="known_speaker_references[]")
    keywords: list[str] | None = Field(default=None, alias="keywords[]")
    languages: list[str] | None = Field(default=None, alias="languages[]")
    # Extension: the keywords in the prompt as well as in the logit bonus (faster-whisper's hotwords)
    keywords_in_prompt: bool | None = None
    # Extension (diarized_json): each channel of a stereo upload is one speaker; None: when the channels differ
    speaker_per_channel: bool | None = None
    # Extension (verbose_json): each segment (and word) with its `speaker`, as diarized_json labels them
    diarize: bool | None = None
    # Extensions (diarized_json, or verbose_json with diarize): the number of speakers, or its bounds (pyannote's)
    num_speakers: int | None = Field(default=None, ge=1, le=MAX_SPEAKERS)
    min_speakers: int | None = Field(default=None, ge=1, le=MAX_SPEAKERS)
    max_speakers: int | None = Field(default=None, ge=1, le=MAX_SPEAKERS)


@dataclass(frozen=True, slots=True)
class Upload:
    data: bytes
    filename: str | None
    content_type: str | None


@dataclass(frozen=True, slots=True)
class TranscriptionParams:
    """One validated transcription or translation request."""

    upload: Upload
    model: str
    task: Task
    response_format: ResponseFormat
    language: str | None  # ISO code
    prompt: str | None
    temperature: float
    stream: bool = False  # answer with transcript.text.* server-sent events
    chunking: ChunkingOptions | None = None  # chunking_strategy: VAD windows decoded in parallel
    granularities: frozenset[str] = frozenset({"segment"})  # timestamp_granularities[]: segment and/or word
    logprobs: bool = False  # include[]=logprobs
    languages: tuple[str, ...] | None = None  # languages[]: detection picks among these ISO codes
    keywords: tuple[str, ...] = ()  # keywords[]: words and phrases the decode is biased toward
    known_speakers: tuple[tuple[str, bytes], ...] = ()  # known_speaker_names[] with their references' audio bytes
    speaker_per_channel: bool | None = None  # diarized_json: a speaker per channel (None: when the channels differ)
    speaker_count: SpeakerCount | None = None  # diarized_json: num_speakers, min_speakers, max_speakers
    diarize: bool = False  # verbose_json with each segment's speaker
    # Whisper's decoding knobs (extensions), the DecodeOptions fields of the same names; None: the server's setting
    best_of: int | None = None
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    keywords_in_prompt: bool | None = None

    def decoding_overrides(self) -> dict[str, int | float | bool]:
        """The knobs this request sets, as DecodeOptions fields."""
        knobs = {"best_of": self.best_of, "beam_size": self.beam_size, "patience": self.patience,
                 "length_penalty": self.length_penalty, "keywords_in_prompt": self.keywords_in_prompt}  # fmt: skip
        return {k: v for k, v in knobs.items() if v is not None}


MAX_CHAT_MESSAGES = 256
# Text around the audio (the instruction): read for a wish to translate and shown to the chat template.
MAX_CHAT_TEXT_CHARS = 65536


class InputAudio(BaseModel):
    data: str
    format: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = Field(default=None, max_length=MAX_CHAT_TEXT_CHARS)
    input_audio: InputAudio | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = Field(default=None, max_length=MAX_CHAT_TEXT_CHARS)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The subset of chat completions this server acts on; other fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Whisper's decoding temperature, as the transcription route takes it: 0 is Whisper's fallback from 0 up
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)  # of the transcript: it is cut there (finish_reason length)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    language: str | None = None  # extension: ISO code of the audio's language

    @property
    def token_limit(self) -> int | None:
        limits = [n for n in (self.max_tokens, self.max_completion_tokens) if n is not None]
        return min(limits) if limits else None


class DurationUsage(BaseModel):
    """`usage` of duration-billed models; OpenAI reports whole seconds."""

    type: Literal["duration"] = "duration"
    seconds: int


class Logprob(BaseModel):
    """A token's log-probability as OpenAI sends it (the SDK's type reads `bytes` as numbers; they are bytes)."""

    token: str
    bytes: list[int]
    logprob: float


class TranscriptionJSON(Transcription):
    usage: DurationUsage | None = None
    logprobs: list[Logprob] | None = None


class TranscriptionVerboseJSON(TranscriptionVerbose):
    task: Literal["transcribe"] = "transcribe"
    usage: DurationUsage | None = None


class TranslationJSON(Translation):
    pass


class TranslationVerboseJSON(TranslationVerbose):
    task: Literal["translate"] = "translate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
