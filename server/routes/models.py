"""GET /v1/models: every served model's ids (the default model's first, with `whisper-1` and any aliases), and
with several models each one's state (ready, loading, down)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..errors import APIError
from ..protocol import Model, ModelList
from ..served_models import ServedModels

router = APIRouter(tags=["models"])
OWNER = "whisper-server"


def served_models(request: Request) -> list[Model]:
    created = request.app.state.created
    models: ServedModels = request.app.state.models
    several = len(models.models) > 1
    return [
        Model(id=i, object="model", created=created, owned_by=OWNER, **({"state": m.state} if several else {}))
        for m in models.models
        for i in m.spec.ids
    ]


@router.get("/v1/models", response_model_exclude_none=True)
async def list_models(request: Request) -> ModelList:
    return ModelList(data=served_models(request))


@router.get("/v1/models/{model:path}", response_model_exclude_none=True)
async def retrieve_model(model: str, request: Request) -> Model:
    for entry in served_models(request):
        if entry.id == model:
            return entry
    raise APIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
