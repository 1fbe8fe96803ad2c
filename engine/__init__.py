"""A pure-PyTorch Whisper engine with continuous batching: `Engine(EngineConfig(model="tiny.en"))`.

The server's one door into the engine: everything it uses is imported from here. The package's map is in
engine/README.md.
"""

from engine.audio import (
    SAMPLE_RATE,
    TOKENS_PER_SECOND,
    AudioDecodeError,
    AudioTooLongError,
    decode_audio,
    decode_channels,
)
from engine.config import EngineConfig
from engine.cpus import available_cpus
from engine.diarization import (
    MAX_SPEAKERS,
    Diarization,
    DiarizationJob,
    DiarizedSegment,
    SpeakerCount,
    SpeakerDiarizer,
    SpeakerTurn,
    diarized_segments,
    segment_speakers,
    speaker_label,
    speaker_labels,
)
from engine.engine import Engine
from engine.engine_process import EngineProcess
from engine.frontend import EngineLike, Handle, RequestHandle
from engine.kernels.options import KernelOptions
from engine.longform.vad import VoiceActivityDetector
from engine.model.tokenizer import LANGUAGES
from engine.model_runner import resolve_device
from engine.pool import EnginePool
from engine.request import (
    DEFAULT_TEMPERATURES,
    MAX_BEAM_SIZE,
    MAX_BEST_OF,
    ChunkingOptions,
    DecodeBudgetExceededError,
    DecodeOptions,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineStats,
    InvalidRequestError,
    RequestAbortedError,
    Segment,
    SegmentEvent,
    Task,
    TokenLogprob,
    TranscriptionResult,
    Word,
)


def start_engine(config: EngineConfig, own_process: bool, gpu: int | None = None) -> EngineLike:
    """Load the model and start serving: in this process (a loop thread) or in a child process of its own (which
    sees only GPU `gpu`, when given)."""
    engine = EngineProcess(config, gpu) if own_process else Engine(config)
    engine.start()
    return engine


__all__ = [
    "DEFAULT_TEMPERATURES",
    "LANGUAGES",
    "MAX_BEAM_SIZE",
    "MAX_BEST_OF",
    "MAX_SPEAKERS",
    "SAMPLE_RATE",
    "TOKENS_PER_SECOND",
    "AudioDecodeError",
    "AudioTooLongError",
    "ChunkingOptions",
    "DecodeBudgetExceededError",
    "DecodeOptions",
    "Diarization",
    "DiarizationJob",
    "DiarizedSegment",
    "Engine",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineLike",
    "EngineOverloadedError",
    "EnginePool",
    "EngineProcess",
    "EngineStats",
    "Handle",
    "InvalidRequestError",
    "KernelOptions",
    "RequestAbortedError",
    "RequestHandle",
    "Segment",
    "SegmentEvent",
    "SpeakerCount",
    "SpeakerDiarizer",
    "SpeakerTurn",
    "Task",
    "TokenLogprob",
    "TranscriptionResult",
    "VoiceActivityDetector",
    "Word",
    "available_cpus",
    "decode_audio",
    "decode_channels",
    "diarized_segments",
    "resolve_device",
    "segment_speakers",
    "speaker_label",
    "speaker_labels",
    "start_engine",
]
