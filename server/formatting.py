"""TranscriptionResult → OpenAI's json / verbose_json / text / srt / vtt bodies (pure; shared by HTTP and CLI)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from openai.types.audio.transcription_diarized import TranscriptionDiarized, UsageDuration
from openai.types.audio.transcription_diarized_segment import TranscriptionDiarizedSegment
from openai.types.audio.transcription_language import TranscriptionLanguage
from openai.types.audio.transcription_text_done_event import Usage as TokenUsage
from openai.types.audio.transcription_text_done_event import UsageInputTokenDetails
from openai.types.audio.transcription_word import TranscriptionWord

from engine import (
    LANGUAGES,
    TOKENS_PER_SECOND,
    DiarizedSegment,
    Segment,
    Task,
    TokenLogprob,
    TranscriptionResult,
    speaker_label,
)

from .protocol import (
    DurationUsage,
    ResponseFormat,
    TranscriptionJSON,
    TranscriptionSegment,
    TranscriptionVerboseJSON,
    TranslationJSON,
    TranslationVerboseJSON,
)

JSON_MEDIA_TYPE = "application/json"
# OpenAI answers text, srt and vtt alike with text/plain; the SDK hands the body back as a str.
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class FormattedBody:
    content: str
    media_type: str


def language_name(code: str) -> str:
    """ISO code → Whisper's lowercase English name ("en" → "english"), as verbose_json reports it."""
    return LANGUAGES.get(code, code)


def duration_usage(duration: float) -> DurationUsage:
    return DurationUsage(seconds=math.ceil(duration))


def token_usage(result: TranscriptionResult) -> TokenUsage:
    """The tokens-shaped usage of OpenAI's `transcript.text.done`: audio in as encoder positions, text out."""
    audio_tokens = math.ceil(result.duration * TOKENS_PER_SECOND)
    return TokenUsage(
        type="tokens",
        input_tokens=audio_tokens,
        input_token_details=UsageInputTokenDetails(audio_tokens=audio_tokens, text_tokens=0),
        output_tokens=result.num_tokens,
        total_tokens=audio_tokens + result.num_tokens,
    )


def token_logprobs(segments: list[Segment], start: int = 0, end: int | None = None) -> list[dict]:
    """OpenAI's `logprobs` items (`{token, bytes, logprob}`) of the tokens that begin within characters
    [start, end) of the transcript the segments make (their texts joined, leading spaces stripped)."""
    items, position = [], 0  # bytes into the joined texts
    text = "".join(s.text for s in segments)
    lead = len(text) - len(text.lstrip())
    first = len(text[: lead + start].encode())
    last = math.inf if end is None else len(text[: lead + end].encode())
    for segment in segments:
        for item in segment.logprobs or ():
            if first <= position < last or (position < first < position + len(item.bytes)):
                items.append(_logprob_item(item))
            position += len(item.bytes)
    return items


class LogprobStream:
    """token_logprobs of consecutive character ranges [0, a), [a, b), ... of a transcript that grows segment by
    segment (a stream's deltas): each token is looked at once, however long the stream, where calling
    token_logprobs on all the segments so far for each delta would walk them all again each time."""

    def __init__(self) -> None:
        self.text = ""  # the segments' texts joined
        self.items: list[TokenLogprob] = []
        self.starts: list[int] = []  # each item's first byte in the joined texts
        self.size = 0  # bytes of the items so far
        self.lead: int | None = None  # characters of leading whitespace, fixed by the first range taken
        self.chars = 0  # characters of the (stripped) transcript taken so far
        self.first = 0  # their end, in bytes of the joined texts
        self.next = 0  # the first item not taken yet

    def add(self, segments: list[Segment]) -> None:
        for segment in segments:
            self.text += segment.text
            for item in segment.logprobs or ():
                self.items.append(item)
                self.starts.append(self.size)
                self.size += len(item.bytes)

    def take(self, start: int, end: int) -> list[dict]:
        """The items of characters [start, end): `start` is where the last range ended."""
        if self.lead is None:
            self.lead = len(self.text) - len(self.text.lstrip())
            self.first = len(self.text[: self.lead].encode())
        assert start == self.chars, (start, self.chars)
        first = self.first
        last = first + len(self.text[self.lead + start : self.lead + end].encode())
        items, starts, i = self.items, self.starts, self.next
        chosen = []
        if i > 0 and starts[i - 1] < first < starts[i - 1] + len(items[i - 1].bytes):  # spans into this range
            chosen.append(items[i - 1])
        while i < len(items) and starts[i] < last:
            if starts[i] >= first or starts[i] + len(items[i].bytes) > first:
                chosen.append(items[i])
            i += 1
        self.next, self.chars, self.first = i, end, last
        return [_logprob_item(item) for item in chosen]


def _logprob_item(item: TokenLogprob) -> dict:
    return {"token": item.token, "bytes": list(item.bytes), "logprob": _finite(item.logprob, -1e9)}


def _finite(value: float, default: float) -> float:
    # JSON has no NaN/inf, and the SDK's models would reject a null.
    return float(value) if math.isfinite(value) else default


def segment_model(segment: Segment, **extra: str) -> TranscriptionSegment:
    return TranscriptionSegment(
        **extra,
        id=segment.id,
        seek=segment.seek,
        start=round(segment.start, 3),
        end=round(segment.end, 3),
        text=segment.text,
        tokens=list(segment.tokens),
        temperature=segment.temperature,
        avg_logprob=_finite(segment.avg_logprob, -100.0),
        compression_ratio=_finite(segment.compression_ratio, 0.0),
        no_speech_prob=_finite(segment.no_speech_prob, 0.0),
    )


def transcription_json(
    result: TranscriptionResult, logprobs: bool = False, languages: bool = False
) -> TranscriptionJSON:
    """`logprobs`: every text token's (include[]=logprobs); `languages`: the detected language as OpenAI's
    `languages` list (asked for with languages[])."""
    return TranscriptionJSON(
        text=result.text.strip(),
        usage=duration_usage(result.duration),
        logprobs=token_logprobs(result.segments) if logprobs else None,
        languages=[TranscriptionLanguage(code=result.language)] if languages else None,
    )


def transcription_verbose_json(
    result: TranscriptionResult, granularities: frozenset[str] = frozenset({"segment"}),
    speakers: list[str] | None = None,
) -> TranscriptionVerboseJSON:
    """OpenAI sends `segments` for the segment granularity (the default) and `words` for the word one. `speakers`
    (the `diarize` extension): each segment's speaker (most of its words'), an extra `speaker` field on it."""
    # `probability` (the word's tokens' mean probability, as faster-whisper and openai/whisper report it) is an
    # extra field: the SDK's TranscriptionWord keeps fields it does not declare
    labels = speakers or [None] * len(result.segments)
    extra = [{"speaker": label} if label is not None else {} for label in labels]
    words = [
        TranscriptionWord(word=w.word.strip(), start=w.start, end=w.end, probability=round(w.probability, 4))
        for s in result.segments
        for w in s.words or ()
    ]
    return TranscriptionVerboseJSON(
        language=language_name(result.language),
        duration=float(result.duration),
        text=result.text.strip(),
        segments=[segment_model(s, **x) for s, x in zip(result.segments, extra)]
        if "segment" in granularities
        else None,
        words=words if "word" in granularities else None,
        usage=duration_usage(result.duration),
    )


class SpeakerLetters:
    """OpenAI's speaker labels: a known speaker's name, else A, B, ... in the order the other speakers first
    appear in the transcript."""

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self.names = names or {}
        self.order: dict[int, int] = {}

    def of(self, speaker: int) -> str:
        if speaker in self.names:
            return self.names[speaker]
        return speaker_label(self.order.setdefault(speaker, len(self.order)))


def transcription_diarized(
    result: TranscriptionResult, segments: list[DiarizedSegment], names: dict[int, str] | None = None
) -> TranscriptionDiarized:
    """OpenAI's diarized_json: the transcript in segments of one speaker each, labelled with the known speakers'
    names where they matched, else A, B, ... in order of first appearance."""
    letters = SpeakerLetters(names)
    return TranscriptionDiarized(
        task="transcribe",
        duration=float(result.duration),
        text=result.text.strip(),
        segments=[
            TranscriptionDiarizedSegment(
                type="transcript.text.segment",
                id=f"seg_{i}",
                start=round(s.start, 3),
                end=round(s.end, 3),
                text=s.text,
                speaker=letters.of(s.speaker),
            )
            for i, s in enumerate(segments)
        ],
        usage=UsageDuration(type="duration", seconds=math.ceil(result.duration)),
    )


def translation_json(result: TranscriptionResult) -> TranslationJSON:
    return TranslationJSON(text=result.text.strip())


def translation_verbose_json(result: TranscriptionResult) -> TranslationVerboseJSON:
    return TranslationVerboseJSON(
        language="english",
        duration=float(result.duration),
        text=result.text.strip(),
        segments=[segment_model(s) for s in result.segments],
    )


def _timestamp(seconds: float, decimal_marker: str) -> str:
    total_ms = max(0, round(seconds * 1000))
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, ms = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _cue_text(segment: Segment) -> str:
    # A blank line ends a cue and "-->" starts a timing line in both formats.
    return " ".join(segment.text.split()).replace("-->", "->")


def _cues(segments: list[Segment]) -> list[tuple[Segment, str]]:
    return [(s, text) for s in segments if (text := _cue_text(s))]


def format_srt(segments: list[Segment]) -> str:
    blocks = [
        f"{i}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{text}\n"
        for i, (s, text) in enumerate(_cues(segments), start=1)
    ]
    return "\n".join(blocks)


def format_vtt(segments: list[Segment]) -> str:
    blocks = [f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{text}\n" for s, text in _cues(segments)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def format_text(result: TranscriptionResult) -> str:
    return result.text.strip() + "\n"


def render(
    result: TranscriptionResult,
    response_format: ResponseFormat,
    task: Task,
    granularities: frozenset[str] = frozenset({"segment"}),
    logprobs: bool = False,
    languages: bool = False,
    diarized: tuple[list[DiarizedSegment], dict[int, str]] | None = None,
    speakers: list[str] | None = None,
) -> FormattedBody:
    """The exact body OpenAI sends for `response_format`; `diarized`: the speakers' segments of diarized_json and
    the known speakers' names."""
    if response_format is ResponseFormat.DIARIZED_JSON:
        assert diarized is not None
        return FormattedBody(transcription_diarized(result, *diarized).model_dump_json(exclude_none=True),
                             JSON_MEDIA_TYPE)  # fmt: skip
    if response_format is ResponseFormat.TEXT:
        return FormattedBody(format_text(result), TEXT_MEDIA_TYPE)
    if response_format is ResponseFormat.SRT:
        return FormattedBody(format_srt(result.segments), TEXT_MEDIA_TYPE)
    if response_format is ResponseFormat.VTT:
        return FormattedBody(format_vtt(result.segments), TEXT_MEDIA_TYPE)
    if response_format is ResponseFormat.VERBOSE_JSON:
        if task is Task.TRANSLATE:
            verbose = translation_verbose_json(result)
        else:
            verbose = transcription_verbose_json(result, granularities, speakers)
        return FormattedBody(verbose.model_dump_json(exclude_none=True), JSON_MEDIA_TYPE)
    if task is Task.TRANSLATE:
        return FormattedBody(translation_json(result).model_dump_json(exclude_none=True), JSON_MEDIA_TYPE)
    body = transcription_json(result, logprobs, languages)
    return FormattedBody(body.model_dump_json(exclude_none=True), JSON_MEDIA_TYPE)
