"""GET /v1/models: the served model, its `whisper-1` alias and any configured aliases."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..deps import SettingsDep
from ..errors import APIError
from ..protocol import Model, ModelList

router = APIRouter(tags=["models"])
OWNER = "whisper-server"


def served_models(request: Request, model_ids: list[str]) -> list[Model]:
    created = request.app.state.created
    return [Model(id=i, object="model", created=created, owned_by=OWNER) for i in model_ids]


@router.get("/v1/models", response_model_exclude_none=True)
async def list_models(request: Request, settings: SettingsDep) -> ModelList:
    return ModelList(data=served_models(request, settings.model_ids))


@router.get("/v1/models/{model:path}", response_model_exclude_none=True)
async def retrieve_model(model: str, request: Request, settings: SettingsDep) -> Model:
    for entry in served_models(request, settings.model_ids):
        if entry.id == model:
            return entry
    raise APIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
