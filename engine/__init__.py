"""A pure-PyTorch Whisper engine with continuous batching: `Engine(EngineConfig(model="tiny.en"))`.

The server's one door into the engine: what it imports comes from here.
"""

from engine.config import EngineConfig
from engine.engine import Engine, RequestHandle
from engine.engine_process import EngineProcess
from engine.model_runner import resolve_device
from engine.request import (
    DecodeBudgetExceededError,
    DecodeOptions,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestAbortedError,
    Segment,
    Task,
    TranscriptionResult,
    Word,
)

EngineLike = Engine | EngineProcess


def start_engine(config: EngineConfig, own_process: bool) -> EngineLike:
    """Load the model and start serving: in this process (a loop thread) or in a child process of its own."""
    engine = (EngineProcess if own_process else Engine)(config)
    engine.start()
    return engine


__all__ = [
    "DecodeBudgetExceededError",
    "DecodeOptions",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineLike",
    "EngineOverloadedError",
    "EngineProcess",
    "InvalidRequestError",
    "RequestAbortedError",
    "RequestHandle",
    "Segment",
    "Task",
    "TranscriptionResult",
    "Word",
    "resolve_device",
    "start_engine",
]
