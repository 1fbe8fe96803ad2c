"""A pure-PyTorch Whisper engine with continuous batching: `Engine(EngineConfig(model="tiny.en"))`."""

from .config import EngineConfig
from .engine import Engine, RequestHandle
from .request import DecodeOptions, Segment, Task, TranscriptionResult, Word

__all__ = ["DecodeOptions", "Engine", "EngineConfig", "RequestHandle", "Segment", "Task", "TranscriptionResult", "Word"]
