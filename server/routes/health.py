"""GET /health (200 only while the engine loop is alive) and GET /metrics (Prometheus text)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..deps import MetricsDep
from ..errors import APIError

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(request: Request) -> dict[str, str]:
    engine = request.app.state.engine
    if engine is None:
        raise APIError(503, "The model is still loading.", code="engine_unavailable")
    if not engine.is_alive:
        raise APIError(503, "The engine loop is not running.", code="engine_unavailable")
    return {"status": "ok", "model": engine.model_name}


@router.get("/metrics")
async def metrics(request: Request, metrics: MetricsDep) -> Response:
    engine = request.app.state.engine
    # in a thread: with the engine in its own process, stats are a round trip to it (answered between its steps),
    # which must not hold up the event loop's other requests
    stats = await asyncio.to_thread(engine.stats) if engine is not None and engine.is_alive else None
    return Response(metrics.render(stats), media_type=CONTENT_TYPE_LATEST)
