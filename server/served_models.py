"""The models a server serves, each in an engine of its own, found by the ids requests name them by.

The first is the default (`whisper-1` and --model-alias are its ids); --extra-model adds more. Each engine has its
own supervisor, which publishes it on its ServedModel: a crash of one model's engine fails only the requests it
held, and its supervisor restarts it while the other models serve on.

With `--model-ttl-s` (speaches' TTL) a model is loaded on its first request and unloaded once it has been idle
that long, nothing queued or decoding; a request that arrives while it loads waits for it (up to
`--model-load-timeout-s`). Such a model's engine runs in a process of its own, so that unloading it gives its
memory back. `POST /v1/models/{id}/load` and `DELETE /v1/models/{id}` (routes/models.py) do the same by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from engine import EngineError, EngineLike, EngineStats, resolve_device

from .errors import APIError
from .metrics import Metrics
from .settings import ServedModelSpec, Settings
from .supervisor import EngineSupervisor

logger = logging.getLogger(__name__)

TTL_POLL_S = 1.0


@dataclass
class ServedModel:
    spec: ServedModelSpec
    ttl_s: float  # unloaded after this long idle; negative: never
    engine: EngineLike | None = None  # published by its supervisor; None while it loads or restarts
    supervisor: EngineSupervisor | None = None
    loading: asyncio.Task | None = None
    unloading: bool = False  # its engine is stopping (a process exiting): unloaded once it has
    unloaded: bool = False  # loads on demand (a --model-ttl-s model before its first request, or after an unload)
    last_used: float = field(default_factory=time.monotonic)
    members: list[EngineSupervisor] = field(default_factory=list)  # data parallel engines' supervisors (app.py)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def adapters(self) -> list[str]:
        """Its LoRA adapters' names, which requests name as their model."""
        return self.spec.adapters

    @property
    def state(self) -> str:
        if self.unloading:
            return "unloading"
        if self.loading is not None and not self.loading.done():
            return "loading"
        if self.supervisor is None and self.engine is None:  # not started yet, or unloaded
            return "unloaded" if self.unloaded else "loading"
        if self.engine is None:
            return "loading"
        return "ready" if self.engine.is_alive else "down"

    def stats(self) -> EngineStats | None:
        """Its engine's stats (a round trip to its process, if it has one); None while it is not running."""
        engine = self.engine
        if engine is None or not engine.is_alive:
            return None
        try:
            return engine.stats()
        except EngineError:  # it died meanwhile
            return None

    def busy(self) -> bool:
        """Whether its engine holds requests (queued or decoding)."""
        stats = self.stats()
        return stats is not None and stats.num_waiting + stats.num_running > 0


class ServedModels:
    def __init__(
        self, settings: Settings, metrics: Metrics | None = None, engine: EngineLike | None = None, frontend=None
    ) -> None:
        """`engine`: the default model's, already started (create_app's `engine`; its owner runs it); `frontend`:
        the FrontEndPlan of several front-end processes (the first starts each engine in a process listening for
        the others, which connect to it)."""
        self.settings = settings
        self.metrics = metrics
        self.frontend = frontend
        self.models = []
        for spec in settings.served_models():
            ttl_s = settings.model_ttl_s if spec.ttl_s is None else spec.ttl_s
            self.models.append(ServedModel(spec, ttl_s, unloaded=ttl_s >= 0))
        self.models[0].engine = engine
        self.by_id = self._by_id()
        self.ttl_watch: asyncio.Task | None = None

    def _by_id(self) -> dict[str, ServedModel]:
        """Every id a request may name (a model's ids, its adapters) to its model."""
        return {model_id: model for model in self.models for model_id in [*model.spec.ids, *model.adapters]}

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def find(self, model_id: str) -> ServedModel:
        """The model of that id (the routes have checked that it is one: parsing.fields.check_model)."""
        return self.by_id[model_id]

    def adapter(self, model_id: str | None) -> str | None:
        """The LoRA adapter a request for `model_id` decodes with: the id itself where it names one, else None."""
        model = None if model_id is None else self.by_id.get(model_id)
        return model_id if model is not None and model_id in model.adapters else None

    def label(self, model_id: str) -> str:
        """What the metrics call a request's model: the adapter it names, else its model's id (an alias counts for
        its model)."""
        return self.adapter(model_id) or self.find(model_id).id

    def engine(self, model_id: str | None = None) -> EngineLike:
        """The running engine of the model requests name `model_id` (the default's for None); a 503 while it
        loads, restarts or is down. An unloaded model starts loading (ready() waits for it)."""
        model = self.default if model_id is None else self.find(model_id)
        model.last_used = time.monotonic()
        engine = model.engine
        if engine is None or not engine.is_alive:
            if model.state == "unloaded":
                self.start_loading(model)
            also = "" if len(self.models) == 1 else f" for the model '{model.id}'"
            raise APIError(503, f"The engine{also} is not running.", code="engine_unavailable",
                           headers={"Retry-After": "1"})  # fmt: skip
        return engine

    async def ready(self, model_id: str | None = None) -> EngineLike:
        """engine(), once an unloaded or loading model is loaded (a 503 if that takes longer than
        --model-load-timeout-s)."""
        model = self.default if model_id is None else self.find(model_id)
        if model.unloaded or (model.state == "loading" and model.loading is not None):
            task = self.start_loading(model)
            try:
                await asyncio.wait_for(asyncio.shield(task), self.settings.model_load_timeout_s)
            except TimeoutError:
                raise APIError(503, f"The model '{model.id}' is still loading; retry.", code="model_loading",
                               headers={"Retry-After": "5"}) from None  # fmt: skip
            except Exception:  # noqa: BLE001 - logged where it loads; engine() below answers the 503
                logger.debug("a request waited for %s, which failed to load", model.id)
        return self.engine(model_id)

    # ---- the engines' life cycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every model without a TTL, one after another (each engine's memory plan sees the ones before); the
        others load on their first request. A failure here is the server's start-up failure."""
        for model in self.models:
            if model.ttl_s < 0:
                await self._load(model)
        self.ttl_watch = asyncio.ensure_future(self._watch_ttl())

    def start_loading(self, model: ServedModel) -> asyncio.Task:
        if model.loading is None or model.loading.done():
            model.loading = asyncio.ensure_future(self._load(model))
            model.loading.add_done_callback(lambda task: task.cancelled() or task.exception())  # logged in _load
        return model.loading

    def link_config(self, config):
        """The engine config this front-end's link to an engine goes by: with several front-ends, its share of the
        requests that may wait."""
        if self.frontend is None:
            return config
        return dataclasses.replace(config, max_waiting=self.frontend.share(config.max_waiting))

    def engine_address(self, model: int, member: int = 0) -> dict:
        """EngineSupervisor's `listen` (the first of several front-ends) or `connect` (the others) for the engine of
        served model `model` (its data parallel engine `member`); nothing with one front-end."""
        if self.frontend is None:
            return {}
        address = self.frontend.engine(model, member)
        return {"listen": address} if self.frontend.first else {"connect": address}

    async def _load(self, model: ServedModel) -> None:
        settings = self.settings
        config = self.link_config(model.spec.config)
        if self.frontend is None or self.frontend.first:
            logger.info("loading %s (%s)", model.id, config)
        # a model that may be unloaded runs in its own process: unloading it then gives all its memory back;
        # several front-ends share each engine's process
        own_process = (
            settings.engine_process == "on"
            or model.ttl_s >= 0
            or self.frontend is not None
            or (settings.engine_process == "auto" and resolve_device(config.device).type == "cuda")
        )

        def publish(engine: EngineLike | None) -> None:
            model.engine = engine

        name = f"the engine of {model.id}" if len(self.models) > 1 else "the engine"
        supervisor = EngineSupervisor(config, own_process, self.metrics, publish, settings.engine_restarts,
                                      name=name, **self.engine_address(self.models.index(model)))  # fmt: skip
        try:
            engine = await supervisor.start()
        except Exception:
            logger.exception("%s failed to load", model.id)
            raise
        model.supervisor, model.unloaded = supervisor, False
        model.last_used = time.monotonic()
        also = f" (and {', '.join(repr(i) for i in model.spec.ids[1:])})" if len(model.spec.ids) > 1 else ""
        where = f"; engine in process {engine.pid}" if own_process and engine.pid else ""
        logger.info("serving %r%s%s", model.id, also, where)

    async def unload(self, model: ServedModel, force: bool = False) -> bool:
        """Stop the model's engine (its memory goes with its process); False, and nothing done, while it holds
        requests, unless `force` (they are then answered 503)."""
        if model.loading is not None and not model.loading.done():
            with contextlib.suppress(Exception):
                await model.loading
        if model.supervisor is None or model.unloading:
            return True
        if not force and await asyncio.to_thread(model.busy):
            return False
        model.unloading = True
        try:
            await model.supervisor.shutdown()
        finally:
            model.supervisor, model.unloading, model.unloaded = None, False, True
        logger.info("unloaded %s", model.id)
        return True

    async def _watch_ttl(self) -> None:
        while True:
            await asyncio.sleep(TTL_POLL_S)
            for model in self.models:
                if model.ttl_s < 0 or model.supervisor is None:
                    continue
                if await asyncio.to_thread(model.busy):
                    model.last_used = time.monotonic()
                elif time.monotonic() - model.last_used >= model.ttl_s:
                    logger.info("%s idle for %g s: unloading it", model.id, model.ttl_s)
                    await self.unload(model)

    # ---- LoRA adapters added and removed at run time -----------------------------------------------------------

    async def add_adapter(self, model: ServedModel, name: str, folder: str) -> None:
        """Load a PEFT adapter directory on the model (loaded first if it is not), served as `name` from then on,
        also after a restart or a reload of its engine; APIError if the name is taken or the adapter refused."""
        if name in self.by_id:
            raise APIError(409, f"The model '{name}' already exists.", param="id", code="model_exists")
        engine = await self.ready(model.id)
        await self._change_adapter(engine, name, folder)
        self._respec(model, (*model.spec.config.loras, (name, folder)))
        logger.info("adapter %r added to %s", name, model.id)

    async def remove_adapter(self, model: ServedModel, name: str) -> None:
        """Unload the adapter: a 409 while requests use it."""
        engine = model.engine
        if engine is not None and engine.is_alive:
            await self._change_adapter(engine, name, None, busy_status=409)
        self._respec(model, tuple((n, f) for n, f in model.spec.config.loras if n != name))
        logger.info("adapter %r removed from %s", name, model.id)

    @staticmethod
    async def _change_adapter(engine: EngineLike, name: str, folder: str | None, busy_status: int = 400) -> None:
        from engine import AdapterError

        try:
            await asyncio.to_thread(engine.change_adapter, name, folder)
        except AdapterError as exc:
            code = "model_busy" if folder is None else "invalid_adapter"
            raise APIError(busy_status, f"{exc}.", param="id" if folder is None else "adapter", code=code) from None

    def _respec(self, model: ServedModel, loras: tuple[tuple[str, str], ...]) -> None:
        """The model's served description with these adapters: what its ids, its listing and its next engine
        (a restart, a reload) go by."""
        spec = dataclasses.replace(model.spec, config=dataclasses.replace(model.spec.config, loras=loras))
        self.settings.replace_served(model.spec, spec)
        model.spec = spec
        for supervisor in [model.supervisor, *model.members]:  # a restarted engine loads the adapters as they are
            if supervisor is not None:
                supervisor.config = dataclasses.replace(supervisor.config, loras=loras)
        self.by_id = self._by_id()

    async def shutdown(self) -> None:
        if self.ttl_watch is not None:
            self.ttl_watch.cancel()
        for model in self.models:
            if model.loading is not None:
                model.loading.cancel()
        await asyncio.gather(*(m.supervisor.shutdown() for m in self.models if m.supervisor), return_exceptions=True)
