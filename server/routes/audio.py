"""POST /v1/audio/transcriptions and /v1/audio/translations: parse → decode → engine → format."""

from __future__ import annotations

import asyncio
import dataclasses
from functools import partial

from fastapi import APIRouter, Request, Response

from engine import Task, diarized_segments, segment_speakers

from ..deps import MetricsDep, ModelsDep, SettingsDep
from ..formatting import SpeakerLetters, render
from ..parsing.audio import decode_references, decode_upload
from ..parsing.options import decode_options, parse_transcription
from ..protocol import ResponseFormat, TranscriptionForm, TranslationForm
from ..speakers import channels_differ, decode_two_channels, transcribe_channels
from ..streaming import diarized_events, sse_response, submit, transcript_events, wait_result

router = APIRouter(tags=["audio"])


def _form_schema(form_cls: type[TranslationForm]) -> dict:
    """OpenAPI body for the docs; the handler parses the raw form itself (bracketed field names)."""
    schema = form_cls.model_json_schema(by_alias=True)
    schema["properties"] = {"file": {"type": "string", "format": "binary"}, **schema["properties"]}
    schema["required"] = ["file", *schema.get("required", [])]
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


async def _serve(
    request: Request, models: ModelsDep, settings: SettingsDep, metrics: MetricsDep, task: Task
) -> Response:
    params = await parse_transcription(request, settings, task)
    engine = await models.ready(params.model)
    served = models.label(params.model)  # the metrics' model label
    diarized_json = params.response_format is ResponseFormat.DIARIZED_JSON
    diarize = diarized_json or params.diarize  # diarize: verbose_json's segments labelled with speakers
    channels = None
    if diarized_json and params.speaker_per_channel is not False and not params.stream and not params.known_speakers:
        channels = await decode_two_channels(params.upload.data, settings.max_audio_seconds)
        if not (params.speaker_per_channel or channels_differ(channels)):
            channels = None  # one mix: the diarizer finds the speakers
    audio = None if channels is not None else await decode_upload(params.upload.data, settings.max_audio_seconds)
    known = await decode_references(params.known_speakers)
    # word timestamps: a speaker change splits a segment between two words (one speaker per channel needs none)
    words = "word" in params.granularities or (diarize and channels is None)
    options = decode_options(
        params.task, params.language, params.prompt, params.temperature, params.chunking, words, settings,
        logprobs=params.logprobs, languages=params.languages, keywords=params.keywords,
    )  # fmt: skip
    if overrides := params.decoding_overrides():
        options = dataclasses.replace(options, **overrides)
    options = dataclasses.replace(options, adapter=models.adapter(params.model))

    drain = request.app.state.drain
    if channels is not None:
        result, segments, per_channel = await transcribe_channels(engine, channels, options, request, drain)
        for r in per_channel:
            metrics.observe_result(task, r, model=served)
        body = render(result, params.response_format, task, diarized=(segments, {}))
        return Response(body.content, media_type=body.media_type)
    handle = submit(engine, audio, options, drain)
    # who spoke when, in a worker thread while the engine decodes; it holds its own reference to the samples
    turns = None
    if diarize:
        turns = asyncio.create_task(request.app.state.diarizer.diarize(audio, known, params.speaker_count))
    del audio  # the engine has the samples: hours of audio are not held twice while it decodes
    if params.stream:
        on_done = partial(metrics.observe_result, task, model=served)
        if turns is not None:
            return sse_response(handle, diarized_events(handle, turns, on_done, drain), drain)
        events = transcript_events(handle, on_done, drain, params.logprobs)
        return sse_response(handle, events, drain)
    try:
        result = await wait_result(handle, request, drain)
    except BaseException:
        if turns is not None:
            turns.cancel()
        raise
    metrics.observe_result(task, result, model=served)
    diarized = labels = None
    if turns is not None:
        speakers = await turns
        if diarized_json:
            diarized = (diarized_segments(result.segments, speakers.turns), speakers.names)
        else:
            letters = SpeakerLetters(speakers.names)
            labels = [letters.of(s) for s in segment_speakers(result.segments, speakers.turns)]
    body = render(result, params.response_format, task, params.granularities, params.logprobs,
                  languages=params.languages is not None, diarized=diarized, speakers=labels)  # fmt: skip
    return Response(body.content, media_type=body.media_type)


@router.post("/v1/audio/transcriptions", openapi_extra=_form_schema(TranscriptionForm))
async def create_transcription(
    request: Request, models: ModelsDep, settings: SettingsDep, metrics: MetricsDep
) -> Response:
    """Transcribe audio into its own language (OpenAI `audio.transcriptions.create`)."""
    return await _serve(request, models, settings, metrics, Task.TRANSCRIBE)


@router.post("/v1/audio/translations", openapi_extra=_form_schema(TranslationForm))
async def create_translation(
    request: Request, models: ModelsDep, settings: SettingsDep, metrics: MetricsDep
) -> Response:
    """Translate audio into English (OpenAI `audio.translations.create`)."""
    return await _serve(request, models, settings, metrics, Task.TRANSLATE)
