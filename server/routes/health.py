"""GET /health (ready: 200 while the engine is alive and the server not draining), GET /health/live (the process
answers), GET /metrics (Prometheus text)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from engine import EngineError, EnginePool

from ..deps import MetricsDep
from ..errors import APIError

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(request: Request) -> dict[str, str]:
    """Readiness: a load balancer sends traffic only while this is 200."""
    if request.app.state.drain.draining:
        raise APIError(503, "The server is shutting down.", code="server_shutting_down")
    engine = request.app.state.engine
    if engine is None:
        raise APIError(503, "The engine is loading or restarting.", code="engine_unavailable")
    if not engine.is_alive:
        raise APIError(503, "The engine is not running.", code="engine_unavailable")
    body = {"status": "ok", "model": request.app.state.settings.model_id}
    if isinstance(engine, EnginePool):  # ready while any engine is: the others are being restarted
        body["engines"] = f"{len(engine.live())}/{len(engine.engines)}"
    return body


@router.get("/health/live")
async def live() -> dict[str, str]:
    """Liveness: the server process answers (its engine may be restarting)."""
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request, metrics: MetricsDep) -> Response:
    engine = request.app.state.engine
    # in a thread: with the engine in its own process, stats are a round trip to it (answered between its steps),
    # which must not hold up the event loop's other requests
    stats, members = None, None
    if isinstance(engine, EnginePool):  # each engine's series, labelled, and their sums unlabelled
        members = await asyncio.to_thread(engine.member_stats)
        stats = EnginePool.total([s for _, s in members if s is not None])
    elif engine is not None and engine.is_alive:
        try:
            stats = await asyncio.to_thread(engine.stats)
        except EngineError:  # it died meanwhile: the supervisor restarts it; the server's own series still count
            stats = None
    return Response(metrics.render(stats, members), media_type=CONTENT_TYPE_LATEST)
