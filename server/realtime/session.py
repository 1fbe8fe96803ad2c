"""A transcription session's configuration, in the shape of the SDK's `RealtimeTranscriptionSessionCreateRequest`.

The session starts with OpenAI's defaults (24 kHz PCM, server VAD with threshold 0.5, 300 ms prefix padding,
500 ms silence). `session.update` is validated by the SDK's own model, then merged field by field: what an
update leaves out keeps its value, an explicit null turns a feature off (`turn_detection: null`: the client
commits by hand). What is merged is the model's output, not the client's JSON: a value the model coerces
(`"threshold": "0.5"`) is stored as the number it stands for. Values the engine cannot honour, and models the
server does not serve (the HTTP routes' check), are refused with the parameter's path, never ignored.

`turn_detection: {"type": "semantic_vad", "eagerness": ...}` ends a turn when the speaker sounds done, not after a
fixed silence: Silero still hears where speech stops (threshold 0.5, 300 ms prefix padding), and once it has been
followed by the turn's tail of silence, smart-turn v3.2 (engine/transcription/turn_end.py) says how likely the
turn is complete. `eagerness` sets how sure it must be and how long each kind of turn waits (EAGERNESS; `auto`
is `medium`, as OpenAI's):

    eagerness  complete when P >=  a complete turn ends after  an incomplete one waits up to
    low        0.7                 800 ms of silence           8 s
    medium     0.5                 500 ms                      4 s
    high       0.3                 300 ms                      2 s

The maximum waits are OpenAI's (8, 4 and 2 s). `create_response` and `interrupt_response` are echoed and
otherwise ignored: a transcription session has no responses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from openai.types.realtime.realtime_transcription_session_create_request import (
    RealtimeTranscriptionSessionCreateRequest,
)
from pydantic import ValidationError

from ..errors import APIError
from ..parsing.fields import check_model, parse_language
from ..settings import Settings
from .audio_input import FORMATS

DEFAULT_TURN_DETECTION = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
LOGPROBS = "item.input_audio_transcription.logprobs"
IDLE_TIMEOUT_MS = (5_000, 30_000)  # OpenAI's bounds


class SessionError(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Eagerness:
    """semantic_vad's patience: the end-of-turn model's probability at or above which a turn is complete, and how
    long a silence ends a complete turn and an incomplete one."""

    complete_probability: float
    complete_silence_ms: int
    max_wait_ms: int


EAGERNESS = {
    "low": Eagerness(0.7, 800, 8_000),
    "medium": Eagerness(0.5, 500, 4_000),
    "high": Eagerness(0.3, 300, 2_000),
}
EAGERNESS["auto"] = EAGERNESS["medium"]
SEMANTIC_VAD_SILERO = {"threshold": 0.5, "prefix_padding_ms": 300}  # where its speech starts and stops


@dataclass(frozen=True)
class TurnDetection:
    """What turns.py needs to know: Silero's threshold and the turn's padding; the silence that ends a turn
    (semantic_vad: a complete one); `eagerness` under semantic_vad, None under server_vad."""

    threshold: float
    prefix_padding_ms: int
    silence_duration_ms: int
    idle_timeout_ms: int | None
    eagerness: Eagerness | None = None


class SessionConfig:
    """The effective session: `body()` is what session.created / session.updated carry. `settings` says which
    models the server serves."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.model_id = settings.model_id
        self.session = {
            "type": "transcription",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "noise_reduction": None,
                    "transcription": {"model": self.model_id, "language": None, "prompt": ""},
                    "turn_detection": dict(DEFAULT_TURN_DETECTION),
                }
            },
            "include": [],
        }

    def body(self) -> dict:
        return copy.deepcopy(self.session)

    @property
    def input(self) -> dict:
        return self.session["audio"]["input"]

    @property
    def format_type(self) -> str:
        return self.input["format"]["type"]

    @property
    def model(self) -> str:
        """The served model that transcribes the session's turns (one of the ids /v1/models lists)."""
        return self.input["transcription"]["model"]

    @property
    def language(self) -> str | None:
        return self.input["transcription"]["language"]

    @property
    def prompt(self) -> str | None:
        return self.input["transcription"]["prompt"] or None

    @property
    def delay(self) -> str | None:
        """OpenAI's `delay` (minimal ... xhigh): how soon live deltas go out (realtime/partials.py DELAYS)."""
        return self.input["transcription"].get("delay")

    @property
    def logprobs(self) -> bool:
        return LOGPROBS in self.session["include"]

    @property
    def turn_detection(self) -> TurnDetection | None:
        td = self.input["turn_detection"]
        if td is None:
            return None
        if td["type"] == "semantic_vad":
            eagerness = EAGERNESS[td["eagerness"]]
            silero = SEMANTIC_VAD_SILERO
            return TurnDetection(
                silero["threshold"], silero["prefix_padding_ms"], eagerness.complete_silence_ms, None, eagerness
            )
        return TurnDetection(
            td["threshold"], td["prefix_padding_ms"], td["silence_duration_ms"], td.get("idle_timeout_ms")
        )

    def update(self, session: object) -> None:
        """Validate `session` (the client's session.update payload) and merge it; SessionError says what is wrong."""
        if not isinstance(session, dict):
            raise SessionError("session must be an object", "session")
        if session.get("type") != "transcription":
            raise SessionError(
                "this server serves transcription sessions only: session.type must be 'transcription' (connect with "
                "?intent=transcription)",
                "session.type",
            )
        try:
            request = RealtimeTranscriptionSessionCreateRequest.model_validate(session)
        except ValidationError as exc:
            errors = exc.errors()
            # in a union (ServerVad | SemanticVad), the member the client's `type` names says what is wrong, not the
            # members whose `type` it is not
            first = next((e for e in errors if e["type"] != "literal_error" or e["loc"][-1] != "type"), errors[0])
            where = _path(first["loc"], session, first["type"] == "missing")
            raise SessionError(f"invalid session: {where}: {first['msg']}", f"session.{where}") from None
        session = request.model_dump(exclude_unset=True)
        new = copy.deepcopy(self.session)
        if "include" in session:
            new["include"] = list(session["include"] or [])
        audio_input = (session.get("audio") or {}).get("input")
        if audio_input is not None:
            self._merge_input(new["audio"]["input"], audio_input)
        self.session = new

    def _merge_input(self, current: dict, given: dict) -> None:
        if "format" in given:
            fmt = given["format"] or {"type": "audio/pcm"}
            kind = fmt.get("type") or "audio/pcm"
            if kind not in FORMATS:
                raise SessionError(f"unsupported format {kind!r}", "session.audio.input.format.type")
            current["format"] = {"type": kind, "rate": 24000} if kind == "audio/pcm" else {"type": kind}
        if given.get("noise_reduction") is not None:
            raise SessionError(
                "noise_reduction is not supported: denoising the input (spectral gating, RNNoise) raised Whisper's word "
                "error rate at 0-20 dB of noise where it was measured; leave it null",
                "session.audio.input.noise_reduction",
            )
        if "transcription" in given:
            t = given["transcription"] or {}
            model = t.get("model")
            if model is not None:
                try:
                    check_model(model, self.settings)
                except APIError as exc:
                    raise SessionError(exc.message, "session.audio.input.transcription.model", exc.code) from None
            param = "session.audio.input.transcription.language"
            try:  # as the HTTP routes read it: an ISO-639-1 code or Whisper's English name
                language = parse_language(t.get("language"), param)
            except APIError as exc:
                raise SessionError(exc.message, param) from None
            current["transcription"] = {
                "model": self.model_id if model is None else model,
                "language": language,
                "prompt": t.get("prompt") or "",
            }
            if t.get("delay") is not None:  # the SDK's type allows only its values
                current["transcription"]["delay"] = t["delay"]
        if "turn_detection" in given:
            current["turn_detection"] = self._turn_detection(given["turn_detection"])

    @staticmethod
    def _turn_detection(td: dict | None) -> dict | None:
        if td is None:
            return None
        param = "session.audio.input.turn_detection"
        if td.get("type") == "semantic_vad":  # the SDK's model has checked eagerness's value
            for key in ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
                if td.get(key) is not None:
                    raise SessionError(
                        f"{key} is server_vad's: semantic_vad waits as its eagerness says", f"{param}.{key}"
                    )
            out = {"type": "semantic_vad", "eagerness": td.get("eagerness") or "auto"}
            out.update({key: td[key] for key in ("create_response", "interrupt_response") if td.get(key) is not None})
            return out
        out = dict(DEFAULT_TURN_DETECTION)
        for key in ("threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"):
            if td.get(key) is not None:
                out[key] = td[key]
        if not 0.0 < float(out["threshold"]) < 1.0:
            raise SessionError("threshold must be between 0 and 1", param + ".threshold")
        for key in ("prefix_padding_ms", "silence_duration_ms"):
            if not 0 <= int(out[key]) <= 10_000:
                raise SessionError(f"{key} must be between 0 and 10000", f"{param}.{key}")
        idle = out.get("idle_timeout_ms")
        if idle is not None and not IDLE_TIMEOUT_MS[0] <= int(idle) <= IDLE_TIMEOUT_MS[1]:
            raise SessionError(
                f"idle_timeout_ms must be between {IDLE_TIMEOUT_MS[0]} and {IDLE_TIMEOUT_MS[1]}",
                param + ".idle_timeout_ms",
            )
        return out


def _path(loc: tuple, given: object, missing: bool) -> str:
    """A validation error's location as the client's path: the union members pydantic names on the way (`AudioPCM`,
    `ServerVad`, `str`) are not keys of the client's JSON; a missing field's name is the location's last part."""
    parts = []
    for part in loc:
        is_key = isinstance(given, dict) and part in given
        if not is_key and not (isinstance(given, list) and isinstance(part, int) and 0 <= part < len(given)):
            continue
        given = given[part]
        parts.append(str(part))
    if missing and loc and (not parts or parts[-1] != str(loc[-1])):
        parts.append(str(loc[-1]))
    return ".".join(parts)
