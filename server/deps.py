"""Dependencies: the served models' engines, settings and metrics live on `app.state`, built by `create_app` and
the lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .drain import shutting_down
from .metrics import Metrics
from .served_models import ServedModels
from .settings import Settings

# async, though they only read attributes: FastAPI runs a plain `def` dependency in its thread pool, a hop to a
# worker thread and back per dependency and request, each waiting for the GIL that the engine loop also needs.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_models(request: Request) -> ServedModels:
    """The served models, whose engine a request takes once its body says which (ServedModels.ready). A server of
    one model answers 503 before reading a body its engine could not decode (unless it is unloaded: it loads)."""
    if request.app.state.drain.draining:
        raise shutting_down()
    models: ServedModels = request.app.state.models
    if len(models.models) == 1 and models.default.state != "unloaded":
        models.engine()
    return models


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
ModelsDep = Annotated[ServedModels, Depends(get_models)]
