"""A pure-PyTorch Whisper engine with continuous batching: `Engine(EngineConfig(model="tiny.en"))`.

The server's one door into the engine: everything it uses is imported from here. The package's map is in
engine/README.md.

Names load on first use (PEP 562): the command line parses its flags, answers --help and checks its arguments
without importing torch, and a process imports only the parts it touches.
"""

from __future__ import annotations

import importlib

# module -> the names it exports through this package
_EXPORTS: dict[str, tuple[str, ...]] = {
    "engine.audio.constants": ("SAMPLE_RATE", "TOKENS_PER_SECOND"),
    "engine.audio.uploads": ("AudioDecodeError", "AudioTooLongError", "decode_audio", "decode_channels"),
    "engine.config": ("EngineConfig",),
    "engine.cpus": ("available_cpus",),
    "engine.diarization": (
        "MAX_SPEAKERS", "Diarization", "DiarizationJob", "DiarizedSegment", "DiarizerProcess", "SpeakerCount",
        "SpeakerDiarizer", "SpeakerTurn", "diarized_segments", "segment_speakers", "speaker_label", "speaker_labels",
    ),
    "engine.runtime.engine": ("Engine",),
    "engine.processes.engine_process": ("EngineClient", "EngineProcess"),
    "engine.frontend": ("EngineLike", "Handle", "RequestHandle"),
    "engine.kernels.options": ("KernelOptions",),
    "engine.transcription.vad": ("VoiceActivityDetector",),
    "engine.transcription.vad_process": ("SpeechStreamsProcess",),
    "engine.transcription.turn_end": ("EndOfTurnModel",),
    "engine.model.tokenizer": ("LANGUAGES",),
    "engine.runtime.model_runner": ("resolve_device",),
    "engine.processes.pool": ("EnginePool",),
    "engine.request": (
        "DEFAULT_TEMPERATURES", "MAX_BEAM_SIZE", "MAX_BEST_OF", "ChunkingOptions", "DecodeBudgetExceededError",
        "DecodeOptions", "EngineDeadError", "EngineError", "EngineOverloadedError", "EngineStats",
        "InvalidRequestError", "RequestAbortedError", "Segment", "SegmentEvent", "Task", "TokenLogprob",
        "TranscriptionResult", "Word",
    ),
    "engine.model.sources": ("ModelNotFoundError", "check_model", "known_names", "resolve_adapter"),
    "engine.model.lora": ("AdapterError",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


def start_engine(config, own_process: bool, gpu: int | None = None, listen: tuple[str, bytes] | None = None):
    """Load the model and start serving (an EngineLike): in this process (a loop thread) or in a child process of
    its own (which sees only GPU `gpu`, when given, and takes EngineClients at `listen`, when given)."""
    from engine.processes.engine_process import EngineProcess
    from engine.runtime.engine import Engine

    engine = EngineProcess(config, gpu, listen) if own_process or listen else Engine(config)
    engine.start()
    return engine


__all__ = [*sorted(_WHERE), "start_engine"]  # noqa: PLE0605 (built from _EXPORTS, the one list)
