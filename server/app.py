"""create_app(settings, engine=None): the FastAPI app, its lifespan, middleware, routers and error handlers."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from engine import (
    DiarizerProcess,
    EndOfTurnModel,
    EngineLike,
    EnginePool,
    SpeakerDiarizer,
    SpeechStreamsProcess,
    VoiceActivityDetector,
    resolve_device,
)

from . import shared_state
from .auth import APIKeyMiddleware
from .chat_templates import ChatTemplate
from .drain import Drain
from .errors import install_error_handlers
from .heap import freeze_startup_objects
from .logs import REQUEST_ID_HEADER, RequestIdMiddleware
from .metrics import Metrics, MetricsMiddleware
from .realtime.calls import Calls
from .realtime.client_secrets import ClientSecrets
from .realtime.load import CPU_PARTIAL_DECODES, GPU_PARTIAL_DECODES, SharedLoad
from .realtime.speech_batcher import SpeechBatcher
from .routes import audio, chat, health, models, realtime, ui
from .served_models import ServedModels
from .settings import Settings
from .speakers import DiarizationWorker
from .supervisor import EngineSupervisor

logger = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The engines started (then app.state.on_start: the first of several front-ends starts the others), then what
    start-up made frozen out of garbage collection (heap.py)."""
    if app.state.speech_process:
        app.state.speech.start()  # in the background: a storm of first sessions must not wait for its start
    async with _engines(app):
        for start in app.state.on_start:
            await start()
        freeze_startup_objects()
        try:
            yield
        finally:
            for stop in app.state.on_stop:
                await stop()
            await app.state.calls.close_all()
            await asyncio.to_thread(app.state.speech.close)


@asynccontextmanager
async def _engines(app: FastAPI) -> AsyncIterator[None]:
    """Start each model's engine under a supervisor unless the default's was handed to create_app (then its owner
    runs it)."""
    if app.state.settings.diarization_preload:
        await asyncio.to_thread(app.state.diarizer.diarizer.load, "at start-up (--diarization-preload)")
    models: ServedModels = app.state.models
    if models.default.engine is not None:
        yield
        return
    settings: Settings = app.state.settings
    if settings.data_parallel_size > 1:
        async with _data_parallel(app, settings):
            yield
        return
    try:
        await models.start()
        yield
    finally:
        await models.shutdown()


@asynccontextmanager
async def _data_parallel(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    """--data-parallel-size engines, each in its own process under its own supervisor, in one pool: the app's
    engine. They load side by side; a failure to start any of them is the server's start-up failure."""
    members = settings.engine_members()
    pool = EnginePool(len(members))
    models: ServedModels = app.state.models
    supervisors = [
        EngineSupervisor(models.link_config(config), True, app.state.metrics, functools.partial(pool.set, i),
                         settings.engine_restarts, gpu=gpu, name=f"engine {i}", **models.engine_address(0, i))
        for i, (config, gpu) in enumerate(members)
    ]  # fmt: skip
    logger.info("loading %s in %d engines (%s)", settings.model_id, len(members), members[0][0])
    try:
        engines = await asyncio.gather(*(s.start() for s in supervisors), return_exceptions=True)
        failed = [e for e in engines if isinstance(e, BaseException)]
        if failed:  # after all have finished loading, so that the finally below stops every one that started
            raise failed[0]
        app.state.models.default.engine = pool
        app.state.models.default.members = supervisors
        logger.info(
            "serving %r (and 'whisper-1') with %d engines: %s", settings.model_id, len(engines),
            ", ".join(f"process {e.pid}" + (f" on GPU {g}" if g is not None else "") for e, (_, g) in zip(engines, members)),
        )  # fmt: skip
        yield
    finally:
        app.state.models.default.engine = None
        await asyncio.gather(*(s.shutdown() for s in supervisors), return_exceptions=True)


def create_app(settings: Settings | None = None, engine: EngineLike | None = None, frontend=None) -> FastAPI:
    """Build the app. Pass `engine` (already started) to share one across apps or to test without loading;
    `frontend`: the FrontEndPlan of several front-end processes, of which this app is one (frontends.py)."""
    settings = settings or Settings()
    app = FastAPI(title="whisper-server", summary="OpenAI-compatible Whisper speech-to-text", lifespan=lifespan)
    app.state.settings = settings
    app.state.frontend = frontend
    app.state.on_start, app.state.on_stop = [], []  # awaited once the engines are up, and as the server stops
    app.state.metrics = Metrics()
    app.state.models = ServedModels(settings, app.state.metrics, engine, frontend)  # each model's engine, by its ids
    app.state.drain = Drain(settings.drain_timeout_s)
    app.state.chat_template = ChatTemplate(settings.chat_template)
    # what the realtime sessions share
    on_gpu = resolve_device(settings.device).type == "cuda"
    partials = settings.realtime_max_partial_decodes
    if partials is None:
        partials = GPU_PARTIAL_DECODES if on_gpu else CPU_PARTIAL_DECODES
    if frontend is not None:  # the bound is the server's: each front-end holds its share
        partials = frontend.share(partials)
    app.state.realtime = SharedLoad(partials, settings.realtime_partials_wait_for_finals)
    # their turn detection: Silero, and semantic_vad's end-of-turn model (each loads on first use: most servers
    # never ask the second)
    app.state.speech_process = settings.realtime_vad_process == "on" or (
        settings.realtime_vad_process == "auto" and on_gpu
    )
    vad = SpeechStreamsProcess() if app.state.speech_process else VoiceActivityDetector()
    app.state.speech = SpeechBatcher(vad, EndOfTurnModel())
    # diarized_json's speaker turns (the models load on first use)
    diarization_device = settings.device if settings.diarization_device == "auto" else settings.diarization_device
    diarizer = DiarizerProcess if settings.diarization_process else SpeakerDiarizer
    app.state.diarizer = DiarizationWorker(
        diarizer(resolve_device(diarization_device).type, nice=settings.diarization_nice), metrics=app.state.metrics
    )
    app.state.created = int(time.time())
    # Added innermost first: request ids wrap everything, then metrics (401s are counted), then CORS (a browser
    # can read a 401), then the key check, which refuses before any body is read.
    # every realtime client secret minted and not yet used (in memory only: a restart invalidates them), and the
    # WebRTC calls in progress; several front-ends share the first's (shared_state.py)
    directory = None
    if frontend is None:
        app.state.client_secrets = ClientSecrets(settings.realtime_max_client_secrets)
    elif frontend.first:
        state, app.state.client_secrets, directory = shared_state.host(
            frontend.address("state"), settings.realtime_max_client_secrets
        )
        app.state.on_stop.append(lambda: asyncio.to_thread(state.shutdown))
    else:
        app.state.client_secrets, directory = shared_state.connect(
            frontend.address("state"), settings.realtime_max_client_secrets
        )
    app.state.calls = Calls(directory, frontend.index if frontend is not None else 0)
    app.add_middleware(
        APIKeyMiddleware, keys=settings.api_keys(), secrets=app.state.client_secrets,
        protect_health=settings.auth_health, protect_metrics=settings.auth_metrics,
    )  # fmt: skip
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", REQUEST_ID_HEADER, "OpenAI-Beta"],
            expose_headers=[REQUEST_ID_HEADER, "Retry-After"],
            max_age=600,
        )
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(RequestIdMiddleware)
    install_error_handlers(app)
    for module in (audio, chat, models, health, realtime):
        app.include_router(module.router)
    if settings.ui:
        ui.install(app)
    return app
