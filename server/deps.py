"""Dependencies: the engine, settings and metrics live on `app.state`, built by `create_app`/lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from engine import EngineLike

from .drain import shutting_down
from .errors import APIError
from .metrics import Metrics
from .settings import Settings

# async, though they only read attributes: FastAPI runs a plain `def` dependency in its thread pool, a hop to a
# worker thread and back per dependency and request, each waiting for the GIL that the engine loop also needs.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_engine(request: Request) -> EngineLike:
    if request.app.state.drain.draining:
        raise shutting_down()
    engine = request.app.state.engine
    if engine is None or not engine.is_alive:
        raise APIError(503, "The engine is not running.", code="engine_unavailable", headers={"Retry-After": "1"})
    return engine


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
EngineDep = Annotated[EngineLike, Depends(get_engine)]
