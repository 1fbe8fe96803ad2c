"""GET /health (ready: 200 while the engine is alive and the server not draining), GET /health/live (the process
answers), GET /metrics (Prometheus text)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from engine import EngineError, EnginePool, EngineStats

from ..deps import MetricsDep
from ..errors import APIError
from ..served_models import ServedModels

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(request: Request) -> dict:
    """Readiness: a load balancer sends traffic only while this is 200: while any served model's engine runs, or is
    unloaded and loads on demand (the others are loading or being restarted); `models` says each one's state when
    there are several."""
    if request.app.state.drain.draining:
        raise APIError(503, "The server is shutting down.", code="server_shutting_down")
    models: ServedModels = request.app.state.models
    default = models.default.engine
    if all(m.state not in ("ready", "unloaded") for m in models.models):  # an unloaded model loads on demand
        message = "The engine is loading or restarting." if default is None else "The engine is not running."
        raise APIError(503, message, code="engine_unavailable")
    body: dict = {"status": "ok", "model": models.default.id}
    if isinstance(default, EnginePool):  # ready while any engine is: the others are being restarted
        body["engines"] = f"{len(default.live())}/{len(default.engines)}"
    if len(models.models) > 1 or models.default.ttl_s >= 0:
        body["models"] = {m.id: m.state for m in models.models}
    return body


@router.get("/health/live")
async def live() -> dict[str, str]:
    """Liveness: the server process answers (its engine may be restarting)."""
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request, metrics: MetricsDep) -> Response:
    models: ServedModels = request.app.state.models
    engine = models.default.engine
    # in a thread: with the engine in its own process, stats are a round trip to it (answered between its steps),
    # which must not hold up the event loop's other requests
    stats, members = None, None
    if isinstance(engine, EnginePool):  # each engine's series, labelled, and their sums unlabelled
        members = await asyncio.to_thread(engine.member_stats)
        stats = EnginePool.total([s for _, s in members if s is not None])
    elif len(models.models) > 1:  # each model's engine labelled by the model's id, and their sums
        members = await asyncio.to_thread(_model_stats, models)
        stats = EnginePool.total([s for _, s in members if s is not None])
    elif engine is not None and engine.is_alive:
        try:
            stats = await asyncio.to_thread(engine.stats)
        except EngineError:  # it died meanwhile: the supervisor restarts it; the server's own series still count
            stats = None
    return Response(metrics.render(stats, members), media_type=CONTENT_TYPE_LATEST)


def _model_stats(models: ServedModels) -> list[tuple[str, EngineStats | None]]:
    return [(model.id, model.stats()) for model in models.models]
