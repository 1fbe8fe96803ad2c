"""GET /v1/models: every served model's ids (the default model's first, with `whisper-1` and any aliases), and
with several models (or a --model-ttl-s) each one's state (ready, loading, unloading, unloaded, down); POST /v1/models/{id}/load and DELETE
/v1/models/{id}: load a model now, unload it now (served_models.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..errors import APIError
from ..protocol import Model, ModelList
from ..served_models import ServedModel, ServedModels

router = APIRouter(tags=["models"])
OWNER = "whisper-server"


def served_models(request: Request) -> list[Model]:
    models: ServedModels = request.app.state.models
    several = len(models.models) > 1 or models.default.ttl_s >= 0
    return [model_object(request, m, i, several) for m in models.models for i in m.spec.ids]


def model_object(request: Request, model: ServedModel, model_id: str, with_state: bool = True) -> Model:
    state = {"state": model.state} if with_state else {}
    return Model(id=model_id, object="model", created=request.app.state.created, owned_by=OWNER, **state)


def find(request: Request, model_id: str) -> ServedModel:
    model = request.app.state.models.by_id.get(model_id)
    if model is None:
        raise APIError(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
    return model


@router.get("/v1/models", response_model_exclude_none=True)
async def list_models(request: Request) -> ModelList:
    return ModelList(data=served_models(request))


@router.get("/v1/models/{model:path}", response_model_exclude_none=True)
async def retrieve_model(model: str, request: Request) -> Model:
    for entry in served_models(request):
        if entry.id == model:
            return entry
    raise APIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")


@router.post("/v1/models/{model:path}/load", response_model_exclude_none=True)
async def load_model(model: str, request: Request) -> Model:
    """Load the model now (it is already, unless --model-ttl-s unloaded it or DELETE did): answered once it is
    ready, or a 503 past --model-load-timeout-s."""
    served = find(request, model)
    await request.app.state.models.ready(model)
    return model_object(request, served, model)


@router.delete("/v1/models/{model:path}", response_model_exclude_none=True)
async def unload_model(model: str, request: Request, force: bool = False) -> Model:
    """Unload the model: its engine stops and its memory is given back; its next request loads it again. A 409
    while it holds requests, unless `?force=true` (they are then answered 503)."""
    served = find(request, model)
    if not await request.app.state.models.unload(served, force):
        raise APIError(409, f"The model '{model}' has requests queued or decoding: unload it once they are done, "
                       "or with ?force=true.", param="model", code="model_busy")  # fmt: skip
    return model_object(request, served, model)
