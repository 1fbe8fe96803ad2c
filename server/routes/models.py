"""GET /v1/models: every served model's ids (the default model's first, with `whisper-1` and any aliases, each
model's LoRA adapters after its ids), and with several models, adapters or a --model-ttl-s each one's state (ready,
loading, unloading, unloaded, down); POST /v1/models/{id}/load and DELETE /v1/models/{id}: load a model now, unload
it now (served_models.py); POST /v1/models: add a LoRA adapter, found in --lora-dir; DELETE on an adapter's id
removes it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from ..errors import APIError
from ..parsing.body import read_json, validate_model
from ..protocol import Model, ModelList
from ..served_models import ServedModel, ServedModels

router = APIRouter(tags=["models"])
OWNER = "whisper-server"


def served_models(request: Request) -> list[Model]:
    models: ServedModels = request.app.state.models
    several = len(models.models) > 1 or models.default.ttl_s >= 0 or any(m.adapters for m in models.models)
    return [model_object(request, m, i, several) for m in models.models for i in [*m.spec.ids, *m.adapters]]


def model_object(request: Request, model: ServedModel, model_id: str, with_state: bool = True) -> Model:
    """The model's entry; an adapter's names the model it adapts as its `parent` (vLLM's field for LoRA
    adapters) and shares that model's state."""
    extra = {"state": model.state} if with_state else {}
    if model_id in model.adapters:
        extra["parent"] = model.id
    return Model(id=model_id, object="model", created=request.app.state.created, owned_by=OWNER, **extra)


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


class NewAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.:-]*$")
    adapter: str = Field(min_length=1, max_length=512)  # its directory, inside --lora-dir
    model: str | None = None  # the model it adapts; None: the default


MAX_ADAPTER_BODY_BYTES = 4096


@router.post("/v1/models", status_code=201, response_model_exclude_none=True)
async def add_adapter(request: Request) -> Model:
    """Load a PEFT LoRA adapter directory from --lora-dir on a served model; requests then name it by `id`."""
    settings = request.app.state.settings
    body = validate_model(NewAdapter, await read_json(request, MAX_ADAPTER_BODY_BYTES))
    if settings.lora_dir is None:
        raise APIError(403, "This server adds no adapters at run time: start it with --lora-dir and --max-loras.",
                       code="adapters_disabled")  # fmt: skip
    root = settings.lora_dir.resolve()
    folder = (root / body.adapter).resolve()
    if not folder.is_relative_to(root) or not folder.is_dir():
        raise APIError(400, f"No adapter directory '{body.adapter}' in the server's adapter folder.",
                       param="adapter", code="invalid_adapter")  # fmt: skip
    models: ServedModels = request.app.state.models
    base = models.default if body.model is None else find(request, body.model)
    await models.add_adapter(base, body.id, str(folder))
    return model_object(request, base, body.id)


@router.delete("/v1/models/{model:path}", response_model_exclude_none=True)
async def unload_model(model: str, request: Request, force: bool = False) -> Model:
    """Unload the model: its engine stops and its memory is given back; its next request loads it again. A 409
    while it holds requests, unless `?force=true` (they are then answered 503). On an adapter's id: remove the
    adapter (a 409 while requests use it)."""
    served = find(request, model)
    if request.app.state.frontend is not None:
        raise APIError(403, "This server's front-ends share every model's engine (--api-servers): its models and "
                       "adapters stay loaded.", param="model", code="unload_disabled")  # fmt: skip
    if model in served.adapters:
        entry = model_object(request, served, model)
        await request.app.state.models.remove_adapter(served, model)
        return entry
    if not await request.app.state.models.unload(served, force):
        raise APIError(409, f"The model '{model}' has requests queued or decoding: unload it once they are done, "
                       "or with ?force=true.", param="model", code="model_busy")  # fmt: skip
    return model_object(request, served, model)
