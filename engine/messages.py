"""Typed messages: into the engine loop's inbox, and both ways across the engine process's pipes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.request import DecodeOptions, EngineStats

if TYPE_CHECKING:
    import numpy as np
    import torch

    from engine.frontend import RequestHandle
    from engine.model.tokenizer import Tokenizer


# ---- the engine loop's inbox (any thread -> loop thread; None wakes the loop to stop) ------------------------


@dataclass(slots=True)
class AddRequest:
    handle: RequestHandle
    audio: np.ndarray  # float32 samples at 16 kHz, checked
    options: DecodeOptions  # prepared (EngineFront.prepare)
    # On a GPU the feature worker computes the log-mel before the loop sees the request: (log-mel, the event its
    # kernels recorded) or the exception that computing it raised. None: the loop computes it piece by piece.
    features: tuple[torch.Tensor, Any] | Exception | None = None


@dataclass(slots=True)
class AbortRequest:
    request_id: str


@dataclass(slots=True)
class ChangeAdapter:
    """Load a LoRA adapter from `folder`, or remove it (folder None), between two steps; `done` gets None or the
    AdapterError that says why not. Also what the parent sends an engine process, with a token for the reply
    (AdapterChanged) in place of `done`."""

    name: str
    folder: str | None
    done: Any = None  # concurrent.futures.Future in the loop's inbox
    token: int = 0


# ---- parent -> engine process (engine_process.py) -----------------------------------------------------------


@dataclass(slots=True)
class Submit:
    """Followed on the pipe by the request's `num_samples` float32 samples as raw bytes."""

    request_id: str
    options: DecodeOptions
    num_samples: int


@dataclass(slots=True)
class Abort:
    request_id: str


@dataclass(slots=True)
class StatsQuery:
    token: int


@dataclass(slots=True)
class Shutdown:
    pass


# ---- engine process -> parent -------------------------------------------------------------------------------


@dataclass(slots=True)
class Ready:
    tokenizer: Tokenizer
    n_text_ctx: int
    num_slots: int
    adapter_names: frozenset[str]


@dataclass(slots=True)
class Failed:
    """Loading failed; the parent raises `error` from EngineProcess()."""

    error: BaseException


@dataclass(slots=True)
class Started:
    """The request stopped waiting (its first window got a slot, or it ended first): the parent's backpressure
    count."""

    request_id: str


@dataclass(slots=True)
class Event:
    """One of a request's events: a SegmentEvent, or last its TranscriptionResult or an exception."""

    request_id: str
    item: Any


@dataclass(slots=True)
class Stats:
    token: int
    stats: EngineStats


@dataclass(slots=True)
class AdapterChanged:
    token: int
    error: str | None  # why the change was refused (the AdapterError's message)


@dataclass(slots=True)
class Dead:
    reason: str
