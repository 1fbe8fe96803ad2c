"""create_app(settings, engine=None): the FastAPI app, its lifespan, routers and error handlers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine.engine import Engine
from engine.model_runner import resolve_device
from engine.process import EngineProcess

from .chat_templates import ChatTemplate
from .errors import install_error_handlers
from .metrics import Metrics, MetricsMiddleware
from .routes import audio, chat, health, models
from .settings import Settings

logger = logging.getLogger(__name__)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load and start the engine unless one was handed to create_app (then its owner starts and stops it)."""
    if app.state.engine is not None:
        yield
        return
    settings: Settings = app.state.settings
    config = settings.engine_config()
    logger.info("loading %s (%s)", settings.model, config)
    own_process = settings.engine_process == "on" or (
        settings.engine_process == "auto" and resolve_device(config.device).type == "cuda"
    )
    # Loading weights takes seconds; off the loop so that the process stays responsive to signals.
    engine = await asyncio.to_thread(EngineProcess if own_process else Engine, config)
    engine.start()
    app.state.engine = engine
    logger.info(
        "serving %s as %r (and 'whisper-1')%s", engine.model_name, settings.model_id,
        f"; engine in process {engine.pid}" if own_process else "",
    )  # fmt: skip
    try:
        yield
    finally:
        app.state.engine = None
        await asyncio.to_thread(engine.shutdown)


def create_app(settings: Settings | None = None, engine: Engine | EngineProcess | None = None) -> FastAPI:
    """Build the app. Pass `engine` (already started) to share one across apps or to test without loading."""
    settings = settings or Settings()
    app = FastAPI(title="whisper-server", summary="OpenAI-compatible Whisper speech-to-text", lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = Metrics()
    app.state.chat_template = ChatTemplate(settings.chat_template)
    app.state.created = int(time.time())
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    install_error_handlers(app)
    for module in (audio, chat, models, health):
        app.include_router(module.router)
    return app
