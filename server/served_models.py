"""The models a server serves, each in an engine of its own, found by the ids requests name them by.

The first is the default (`whisper-1` and --model-alias are its ids); --extra-model adds more. Each engine has its
own supervisor, which publishes it here: a crash of one model's engine fails only the requests it held, and its
supervisor restarts it while the other models serve on.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import EngineLike

from .errors import APIError
from .settings import ServedModelSpec


@dataclass
class ServedModel:
    spec: ServedModelSpec
    engine: EngineLike | None = None  # published by its supervisor; None while it loads or restarts

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def state(self) -> str:
        if self.engine is None:
            return "loading"
        return "ready" if self.engine.is_alive else "down"


class ServedModels:
    def __init__(self, specs: list[ServedModelSpec], engine: EngineLike | None = None) -> None:
        """`engine`: the default model's, already started (create_app's `engine`; its owner runs it)."""
        self.models = [ServedModel(spec) for spec in specs]
        self.models[0].engine = engine
        self.by_id = {model_id: model for model in self.models for model_id in model.spec.ids}

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def find(self, model_id: str) -> ServedModel:
        """The model of that id (the routes have checked that it is one: parsing.fields.check_model)."""
        return self.by_id[model_id]

    def engine(self, model_id: str | None = None) -> EngineLike:
        """The running engine of the model requests name `model_id` (the default's for None); a 503 while it
        loads, restarts or is down."""
        model = self.default if model_id is None else self.find(model_id)
        engine = model.engine
        if engine is None or not engine.is_alive:
            also = "" if len(self.models) == 1 else f" for the model '{model.id}'"
            raise APIError(503, f"The engine{also} is not running.", code="engine_unavailable",
                           headers={"Retry-After": "1"})  # fmt: skip
        return engine
