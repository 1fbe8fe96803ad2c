"""Settings: the one place that reads environment variables and CLI flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine import EngineConfig, KernelOptions, available_cpus

MIB = 1024 * 1024


WHISPER_1 = "whisper-1"  # an id every server answers to: clients hard-code OpenAI's model id
MAX_APPEND_BASE64 = 15 * MIB  # OpenAI's limit on one realtime append's audio field: the largest event a client sends
WS_EVENT_ROOM = 64 * 1024  # the JSON around that audio (type, event_id)


@dataclasses.dataclass(frozen=True)
class ServedModelSpec:
    """A model the server serves: the ids requests name it by (its served id first), what --model or
    --extra-model named (a name, a path, a hub id: never shown to clients), its engine's config, and its own
    TTL (None: --model-ttl-s)."""

    ids: list[str]
    source: str
    config: EngineConfig
    ttl_s: float | None = None

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters loaded on it at start, by the name requests give as their model."""
        return [name for name, _ in self.config.loras]

    @property
    def id(self) -> str:
        return self.ids[0]


class ModelEntry(BaseModel):
    """One model of a --models-file."""

    model_config = ConfigDict(extra="forbid")

    model: str
    name: str | None = None
    aliases: list[str] = Field(default_factory=list)
    ttl_s: float | None = None
    loras: dict[str, str] = Field(default_factory=dict)  # adapter name -> PEFT directory


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[ModelEntry] = Field(min_length=1)


def read_models_file(path: Path) -> list[dict]:
    """The entries of a --models-file (YAML, or JSON, which YAML reads too), checked; ValueError says what is
    wrong."""
    import yaml

    try:
        parsed = ModelsFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read the models file: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"models file: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    return [entry.model_dump() for entry in parsed.models]


class IceServer(BaseModel):
    """A STUN or TURN server, as RTCPeerConnection's configuration names it."""

    model_config = ConfigDict(extra="forbid")

    urls: str | list[str]
    username: str | None = None
    credential: str | None = None


class Settings(BaseSettings):
    """Server and engine settings. Every field is also `--kebab-case` on the CLI and `WHISPER_UPPER_CASE` in the env."""

    model_config = SettingsConfigDict(env_prefix="WHISPER_", use_attribute_docstrings=True, extra="forbid")
    _served: list[ServedModelSpec] | None = PrivateAttr(default=None)

    model: str = "tiny.en"
    """Model to load: a known name (tiny.en, base), a local directory or checkpoint, or a hub id. The default
    model: `whisper-1` and --model-alias name it. Given several times, the others are --extra-model's."""
    extra_model: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """More models served beside --model, each in its own engine, repeatable: `SOURCE` (served as its public name,
    e.g. `base`) or `NAME=SOURCE`; a request's `model` says which one decodes it."""
    models_file: Path | None = None
    """A YAML or JSON file that lists the served models instead of --model / --extra-model: `models:`, each
    `{model: SOURCE, name: ID, aliases: [...], ttl_s: SECONDS, loras: {NAME: PATH}}` (only `model` needed), the
    first the default (docs/deployment.md: several models)."""
    lora: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """A LoRA adapter, repeatable: `NAME=PATH`, PATH a PEFT adapter directory (adapter_config.json and
    adapter_model.safetensors) or a hub id (owner/name, fetched as models are) of the default model, or of
    --lora-base's; a request whose `model` is NAME decodes with it, in the same batches as the model's other
    requests."""
    lora_base: str | None = None
    """The served model (its id) that the --lora adapters adapt; None: the default model."""
    lora_dir: Path | None = None
    """The folder adapters added at run time come from: `POST /v1/models` (behind the API key) names a PEFT
    directory inside it. None: no adapter is added at run time."""
    max_loras: int = Field(default=0, ge=0)
    """The most adapters each model keeps loaded, those added at run time (POST /v1/models) included; 0: the
    number given at start, and none can be added."""
    max_lora_rank: int = Field(default=64, ge=1, le=64)
    """On a GPU, the largest rank an adapter may have: every resident adapter's matrices are laid out at this rank
    (the log prints their memory at start-up); lower it to save GPU memory when the adapters have smaller ranks."""
    model_ttl_s: float = -1
    """Unload a model once it has been idle this many seconds (nothing queued or decoding), and load it again on
    its next request (which waits for it); its engine then runs in a process of its own, so that unloading gives
    its memory back. Negative: every model stays loaded."""
    model_load_timeout_s: float = Field(default=300.0, gt=0)
    """How long a request waits for its model to load before it gets a 503 (model_loading) to retry."""
    host: str = "127.0.0.1"
    """Interface to bind the HTTP server to."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of the HTTP server."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device to run the model on; auto picks cuda when available."""
    diarization_device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the speaker diarization models (diarized_json); auto: the model's device (--device)."""
    diarization_preload: bool = False
    """Load the speaker diarization models at start-up; otherwise the first diarized_json request loads them."""
    diarization_nice: int = Field(default=19, ge=0, le=19)
    """OS priority (nice) of the speaker diarization models' threads on Linux: at 19, the lowest, they take only the
    CPU time the engine leaves, so requests beside long diarized_json ones keep their speed (and a diarized answer
    waits longer while the engine stays busy); 0: the engine's own priority."""
    diarization_process: bool = True
    """Run the speaker diarization models in a process of their own, which has its own GIL: in the server's process
    a low-priority diarization thread holding the GIL would hold up the engine and the event loop too."""
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8"] = "auto"
    """Weight and activation dtype; auto is float16 on CUDA, and on a CPU int8 for an int8 checkpoint, else float32.
    int8 (CPU only): the products read int8 weights, a scale per output row; activations stay float32."""
    served_model_name: str | None = None
    """Model id listed by /v1/models and accepted in requests (default: --model); `whisper-1` is accepted too."""
    model_alias: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """More ids the model answers to and /v1/models lists, e.g. OpenAI's `gpt-4o-transcribe-diarize` for clients
    written for it (diarized_json works with any id)."""
    max_upload_mb: float = Field(default=25.0, gt=0)
    """Largest accepted audio upload, in MiB (OpenAI's limit is 25)."""
    max_audio_seconds: float = Field(default=3 * 3600.0, gt=0)
    """Longest accepted audio, in seconds: refused from the file's header before decoding, and while decoding when
    the header says less (a small compressed file can hold hours of silence)."""
    api_key: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """API keys accepted as `Authorization: Bearer <key>` on every /v1 route (several: repeat the flag, or commas
    in the environment variable); none: no authentication."""
    api_key_file: Path | None = None
    """A file of API keys, one per line (blank lines and lines starting with # ignored), added to --api-key."""
    auth_health: bool = False
    """Require an API key on /health too (open by default, for load balancers and probes)."""
    auth_metrics: bool = False
    """Require an API key on /metrics too (open by default, for Prometheus)."""
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Browser origins allowed to call the API (CORS), e.g. https://app.example.com, or * for any; none by default."""
    drain_timeout_s: float = Field(default=8.0, ge=0)
    """On SIGTERM, how long requests in flight may still finish; then they are answered 503 and the server exits
    (the default fits `docker stop`'s 10 s grace)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A request's line and headers must arrive within this many seconds of its connection opening (of its first
    byte, for a later request on a kept-alive connection); else 408 and the connection is closed."""
    body_min_rate_kib_s: float = Field(default=8.0, ge=0)
    """After --body-grace-s from the end of its headers, a request body must have arrived at an average of at least
    this many KiB/s (time the server is not reading excluded); else 408, or the connection closed when the answer
    has started. 0: no minimum. At 8, a 25 MiB upload may take up to ~53 minutes."""
    body_grace_s: float = Field(default=10.0, ge=0)
    """Seconds a request body may take before --body-min-rate-kib-s applies (slow starts, 100 Continue waits)."""
    max_connections_per_ip: int = Field(default=1024, ge=0)
    """Connections open at once from one peer address; past it a new one is answered 429 and closed. Behind a
    reverse proxy every connection is the proxy's: raise it there, or 0 for no cap."""
    engine_restarts: int = Field(default=5, ge=0)
    """How many times in a row a dead engine is restarted (with back-off) before /health stays 503."""
    decode_budget_per_window: int = Field(default=448, ge=1)
    """Tokens a request may sample, fallback retries included, per 30 s of its audio; past it the request ends with
    a 400 instead of occupying the engine (Whisper samples at most 224 per attempt, so the default allows each
    window a full attempt and a full retry)."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as text or as one JSON object per line (with the request id)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Decode slots (sequences decoded together); default comes from the engine's memory plan."""
    max_waiting: int = Field(default=256, ge=1)
    """Requests queued beyond the running batch; past this the server answers 429."""
    gpu_memory_fraction: float = Field(default=0.9, gt=0, le=1)
    """Fraction of GPU memory the engine may plan its caches into."""
    enforce_eager: bool = False
    """Disable CUDA graphs (debugging; slower)."""
    num_threads: int | None = Field(default=None, ge=1)
    """CPU intra-op threads for torch; default is torch's own choice."""
    dummy_weights: bool = False
    """Random weights at the named model's size (benchmarks without downloads)."""
    tokenizer: str | None = None
    """tokenizer.json (or its folder) for weights that ship without one."""
    max_encoder_batch: int | None = Field(default=None, ge=1)
    """Windows encoded together per step (bounds the stall of running decodes); default depends on the device."""
    max_audio_ctx: int | None = Field(default=None, ge=1)
    """Cross-attention cache length; default is the encoder's own (1500)."""
    max_text_ctx: int | None = Field(default=None, ge=1)
    """Self-attention cache length; default is the decoder's own (448)."""
    stepwise_prompt_tokens: int | None = Field(default=None, ge=0)
    """Prompts up to this many tokens are fed by the running batch's decode steps instead of a prefill pass
    while the batch is small; default 8 on a GPU, 0 (always prefill) on a CPU."""
    background_pace: float = Field(default=1.0, ge=1.0)
    """While other requests decode, a live preview (a realtime partial) is admitted once they have decoded this many
    times as long as the last admission took: the share of the loop previews may take from them."""
    short_context_graphs: bool = True
    """CUDA graphs for the encoder passes of live previews' short contexts (a GPU; off: those passes run eagerly,
    for an A/B)."""
    cross_cache_dtype: Literal["auto", "model", "int8"] = "auto"
    """Cross-attention cache type: the model's dtype, or int8 with a scale per vector (half the bytes each decode
    step reads on a GPU; same transcripts in our tests)."""
    encoder_precision: Literal["model", "float8"] = "model"
    """The encoder's products in the model's dtype, or float8 (e4m3, a scale per row; GPUs with FP8 tensor cores):
    faster at high concurrency, at some cost in precision."""
    overlap_steps: bool | None = None
    """Launch each decode step before reading the previous step's tokens, so the host's work between steps runs
    while the GPU computes; default on a GPU, off on a CPU."""
    multi_step: int | None = Field(default=None, ge=1)
    """Greedy decode steps per launch while up to 32 windows decode and none waits (one CUDA graph replays them);
    a window's end is seen up to that many steps late. Default 4 on a GPU, 1 on a CPU."""
    best_of: int = Field(default=1, ge=1, le=10)
    """Samples drawn side by side by each of Whisper's fallback attempts above temperature 0, the likeliest kept
    (openai/whisper's and faster-whisper's best_of, 5 there); a request's `best_of` field overrides it."""
    beam_size: int = Field(default=1, ge=1, le=10)
    """Beams searched by the attempt at temperature 0 (faster-whisper's beam_size, 5 there; 1 = greedy). Each
    beam of a window holds a decode slot while the window decodes; a request's `beam_size` field overrides it."""
    patience: float = Field(default=1.0, gt=0, le=10)
    """Beam search ends once round(beam_size * patience) hypotheses have finished (faster-whisper's patience)."""
    length_penalty: float = Field(default=1.0, ge=0, le=2)
    """Beam hypotheses are ranked by their log-probability over length ** length_penalty (faster-whisper's)."""
    keywords_in_prompt: bool = False
    """keywords[] in every window's prompt as well as in the logit bonus (faster-whisper's hotwords): more of the
    names come out right, and the words around them can change where they are not spoken (BENCHMARKS.md); a
    request's `keywords_in_prompt` field overrides it."""
    seed: int = 0
    """Sampling seed of every request (OpenAI's API has no per-request seed): a temperature-fallback draw depends
    only on it and the request's own audio, never on what else the engine decodes."""
    realtime_max_sessions: int = Field(default=100, ge=0)
    """Realtime sessions open at once, WebSocket (/v1/realtime) and WebRTC (/v1/realtime/calls) together; past this a
    new WebSocket gets an error and is closed, a new call a 429."""
    realtime_ice_servers: Annotated[list[IceServer], NoDecode] = Field(default_factory=list)
    """STUN/TURN servers for WebRTC calls (/v1/realtime/calls), repeatable: a URL (stun:stun.example.com:3478) or
    JSON ({"urls": "turn:turn.example.com:3478", "username": "u", "credential": "p"}). None by default: the server
    offers its own addresses only, enough when clients reach it directly (docs/realtime.md: WebRTC)."""
    realtime_webrtc_connect_timeout_s: float = Field(default=15.0, gt=0)
    """A WebRTC call whose peer has not connected (ICE, DTLS, the events channel) this long after its answer ends."""
    realtime_max_client_secrets: int = Field(default=10000, ge=0)
    """Unexpired realtime client secrets at once (POST /v1/realtime/client_secrets); past this minting gets a 429."""
    realtime_max_buffer_s: float = Field(default=900.0, gt=0)
    """Seconds of uncommitted audio a realtime session may hold (manual commits; server VAD commits by itself)."""
    realtime_max_buffered_seconds_total: float = Field(default=3600.0, gt=0)
    """Seconds of uncommitted audio all realtime sessions together may hold, 64 KB a second (16 kHz float32); an
    append past it gets an error (server_buffer_full) and the audio already buffered stays."""
    realtime_max_partial_decodes: int | None = Field(default=None, ge=0)
    """Live (partial) decodes of open realtime turns in flight at once, server-wide. 0: no live deltas, only each
    turn's transcript at its end. Unset: 16 when the engine runs on a GPU, 4 on a CPU. Each partial decodes the
    turn's new words only, so a GPU batches many side by side; more in flight cost the finals (on a GPU with
    hundreds of sessions in conversation, more made each step larger and brought the first deltas no sooner), and
    on a CPU each partial takes the cores the finals need (BENCHMARKS.md, realtime)."""
    realtime_partials_wait_for_finals: bool = True
    """No partial decode starts while a turn's final decode runs anywhere on the server (finals first: a preview is
    soon replaced, a final is what a voice agent waits for)."""
    realtime_vad_process: Literal["auto", "on", "off"] = "auto"
    """Run the realtime sessions' turn detection (Silero, for every open microphone at once) in a process of its
    own, which has its own GIL: in the server's process each pass holds up the event loop, and so every session's
    events, behind it. auto: on when the engine runs on a GPU (where hundreds of sessions meet the GIL first; the
    process starts with the server), off on a CPU (its cores bound the sessions first, and the process would cost
    ~2 s of CPU at its start and ~230 MB)."""
    realtime_idle_timeout_s: float = Field(default=600.0, gt=0)
    """A realtime session that sends no event for this long gets an error and is closed (a microphone streams
    every 100 ms or so: silence is still audio)."""
    realtime_turn_tail_ms: int = Field(default=200, ge=0)
    """A server-VAD turn's audio ends this long after its speech (at most its silence_duration_ms): the rest of the
    silence is the VAD's wait for the end of the turn, not part of it."""
    realtime_early_final: bool = True
    """Under server VAD a turn's final decode starts as soon as its speech has been followed by realtime_turn_tail_ms
    of silence, while the VAD still waits out silence_duration_ms: the transcript of a turn that does end is then
    ready sooner after it. Speech that resumes within the wait aborts that decode."""
    realtime_short_partials: bool = True
    """A realtime partial decode encodes its turn's audio and realtime_partial_margin_s of padding only (10 s in
    all under 2 s of audio), not a 30 s window (whisper.cpp's audio_ctx): a partial costs a fraction of a full
    window's decode, and its words are mostly the same. The final decode of a turn is always a full window, the HTTP
    route's."""
    realtime_partial_prefix: bool = True
    """A realtime partial decode takes the words its turn has sent as the start of its transcript (Whisper's
    prefix) and decodes only what follows: a refresh of a long turn costs its new words, not the whole turn again,
    so deltas keep their cadence as the turn grows (BENCHMARKS.md, realtime). The final decode of a turn never takes
    a prefix (it is the HTTP route's)."""
    realtime_partials_take_detected_language: bool = True
    """Where a session sets no `language`, its partial decodes take the language its last final transcript was
    detected in (the same model's) instead of detecting it each time: on a multilingual model each detection is a
    language-pick step and the prompt's task tokens fed a step each, every one a launch that several decode steps
    cannot share. A turn's final decode detects the language as the HTTP route does."""
    realtime_partial_margin_s: float = Field(default=3.0, ge=0, le=30)
    """The padding after a short partial's audio that its encoder sees, in seconds."""
    realtime_condition_on_previous_text: bool = True
    """A realtime turn is decoded with the session's previous transcripts as context (after the session's prompt),
    as Whisper's long-form decodes a window after the text of those before it."""
    batch_invariant: bool = False
    """GPU kernels whose results for a request do not depend on what else the batch holds: the same tokens for
    the same audio, options and configuration whatever the load (README: batch invariance). Slower; see
    BENCHMARKS.md. A CPU's decoding does not need it."""
    kernels: KernelOptions = KernelOptions()
    """Which kernels the engine runs, as JSON (e.g. '{"cpu_decode": false}': torch alone on a CPU, without the native
    decode kernels); the defaults are the fastest measured. For A/B runs: engine/kernels/options.py."""
    fixed_decode_tokens: int | None = Field(default=None, ge=1)
    """Benchmarks only: every request decodes exactly this many tokens per 30 s window (EOS ignored, no
    fallbacks)."""
    fixed_decode_tokens_per_second: float | None = Field(default=None, gt=0, le=100)
    """Benchmarks only, instead of --fixed-decode-tokens: each window decodes this many tokens a second of its audio
    (rounded up; EOS ignored, no fallbacks), as speech has: a realtime preview of 2 s then costs what a real one
    does, not a whole turn's tokens."""
    compression_ratio_threshold: float | None = 2.4
    """A window decoded more repetitively than this (gzip ratio) is retried at a higher temperature."""
    log_prob_threshold: float | None = -1.0
    """A window whose average token log-probability is below this is retried at a higher temperature."""
    no_speech_threshold: float | None = 0.6
    """A window whose no-speech probability is above this (and log-probability low) is skipped as silence."""
    chat_template: Path | None = None
    """Jinja template for /v1/chat/completions answers (default: chat_templates/transcript.jinja)."""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """Log level of the server and uvicorn."""
    switch_interval_ms: float = Field(default=0.5, gt=0)
    """How long a Python thread may hold the GIL while another waits for it (Python's default: 5 ms)."""
    data_parallel_size: int = Field(default=1, ge=1, le=64)
    """Engines behind this server, each in a process of its own, requests to the least loaded: one per GPU on CUDA
    (--data-parallel-gpus), or the CPU's cores split between them (--num-threads each, default an equal share)."""
    data_parallel_gpus: Annotated[list[int], NoDecode] = Field(default_factory=list)
    """The GPU of each engine, one index per engine (default 0, 1, ...); a GPU named twice holds two engines, which
    split --gpu-memory-fraction between them."""
    ui: bool = True
    """The playground page at / (--no-ui: none, for locked-down deployments; the API is unchanged)."""
    engine_process: Literal["auto", "on", "off"] = "auto"
    """Run the engine in a process of its own, so that the HTTP side does not share its GIL; auto: on when the
    engine runs on a GPU (where its loop's host work bounds throughput), off on a CPU."""
    api_servers: int = Field(default=1, ge=1, le=64)
    """HTTP front-end processes sharing the port (vLLM's --api-server-count): each has its own event loop, so the
    work of every request and realtime append (WebSocket frames, JSON, base64, resampling, the VAD) spreads over
    that many cores, while each engine, in a process of its own, still batches every front-end's requests. One
    process hears a few thousand realtime appends a second (10 a second per open microphone). With several, every
    model stays loaded (no TTL) and models and adapters are not loaded or removed at run time."""

    @field_validator("api_key", "cors_origins", "model_alias", "extra_model", "lora", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        """`WHISPER_API_KEY=a,b` as well as `--api-key a --api-key b`."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("data_parallel_gpus", mode="before")
    @classmethod
    def _gpu_list(cls, value: object) -> object:
        """`--data-parallel-gpus 0,1` or `--data-parallel-gpus 0 --data-parallel-gpus 1`."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [p.strip() for v in value for p in (v.split(",") if isinstance(v, str) else [v]) if str(p).strip()]
        return value

    @model_validator(mode="after")
    def _distinct_model_ids(self) -> Settings:
        if self.models_file is not None and (self.extra_model or "model" in self.model_fields_set):
            raise ValueError("--models-file lists every served model: leave out --model and --extra-model")
        if self.models_file is not None and (self.lora or self.lora_base):
            raise ValueError("--models-file lists each model's adapters (loras:): leave out --lora and --lora-base")
        if self.lora_dir is not None and not self.max_loras:
            raise ValueError("--lora-dir adds adapters at run time: set --max-loras, the most each model keeps")
        for entry in self.lora:
            name, _, path = entry.partition("=")
            if not name or not path:
                raise ValueError(f"--lora takes NAME=PATH, got {entry!r}")
        seen: set[str] = set()
        for spec in self.served_models():
            for model_id in [*spec.ids, *spec.adapters]:
                if not model_id or model_id in seen:
                    raise ValueError(f"two served models answer to {model_id!r}: name them (--extra-model NAME=SOURCE)")
                seen.add(model_id)
        if len(self.extra_model) and self.data_parallel_size > 1:
            raise ValueError("--data-parallel-size serves one model: several models run one engine each")
        return self

    @model_validator(mode="after")
    def _front_ends_share_loaded_engines(self) -> Settings:
        if self.api_servers == 1:
            return self
        if self.engine_process == "off":
            raise ValueError("--api-servers shares engines between processes: they run in their own (--engine-process)")
        if self.lora_dir is not None:
            raise ValueError("--api-servers: adapters are given at start (--lora), not added at run time (--lora-dir)")
        for spec in self.served_models():
            if (self.model_ttl_s if spec.ttl_s is None else spec.ttl_s) >= 0:
                raise ValueError(f"--api-servers keeps every model loaded: {spec.id} has a TTL (--model-ttl-s)")
        return self

    @model_validator(mode="after")
    def _one_fixed_token_count(self) -> Settings:
        if self.fixed_decode_tokens is not None and self.fixed_decode_tokens_per_second is not None:
            raise ValueError("--fixed-decode-tokens and --fixed-decode-tokens-per-second exclude each other")
        return self

    @model_validator(mode="after")
    def _one_gpu_per_engine(self) -> Settings:
        if self.data_parallel_gpus and len(self.data_parallel_gpus) != self.data_parallel_size:
            raise ValueError(
                f"--data-parallel-gpus names {len(self.data_parallel_gpus)} GPUs for {self.data_parallel_size} "
                "engines (--data-parallel-size): one per engine"
            )
        if any(g < 0 for g in self.data_parallel_gpus):
            raise ValueError("GPU indices are 0 or more")
        return self

    @field_validator("kernels", mode="before")
    @classmethod
    def _kernels_json(cls, value: object) -> object:
        """`--kernels '{"cpu_decode": false}'` (the env var is JSON-decoded by pydantic-settings already)."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"kernels must be a JSON object: {exc}") from exc
        return value

    @field_validator("realtime_ice_servers", mode="before")
    @classmethod
    def _ice_servers(cls, value: object) -> object:
        """Each a URL or a JSON object (a JSON list of them in one value too)."""
        values = value if isinstance(value, list) else [value]
        servers: list[object] = []
        for item in values:
            if not isinstance(item, str):
                servers.append(item)
            elif item.lstrip()[:1] in ("{", "["):
                try:
                    parsed = json.loads(item)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"an ICE server is a URL or a JSON object: {exc}") from exc
                servers.extend(parsed if isinstance(parsed, list) else [parsed])
            elif item.strip():
                servers.append({"urls": item.strip()})
        return servers

    @field_validator("api_key_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @property
    def model_id(self) -> str:
        """The id clients use for the default model: --served-model-name, else the model's name without any local
        path (a client must not learn where the weights sit on the server)."""
        return self.served_models()[0].id

    @property
    def model_ids(self) -> list[str]:
        """Every id requests may name: the default model's (model_id, `whisper-1`, the aliases), then each extra
        model's, in that order, each model's adapters after its ids."""
        return [model_id for spec in self.served_models() for model_id in [*spec.ids, *spec.adapters]]

    def served_models(self) -> list[ServedModelSpec]:
        """The default model, then the extra ones (or the models file's), each with the ids it answers to, its TTL
        and its engine's config. Sharing one GPU, they share its memory fraction equally (each engine plans within
        its share). Worked out once: requests ask for the ids."""
        if self._served is None:
            self._served = self._served_models()
        return self._served

    def replace_served(self, old: ServedModelSpec, new: ServedModelSpec) -> None:
        """A served model described anew: its adapters changed at run time (served_models.py)."""
        served = self.served_models()
        served[served.index(old)] = new

    def _served_models(self) -> list[ServedModelSpec]:
        config = self.engine_config()
        if self.models_file is not None:
            entries = read_models_file(self.models_file)
        else:
            entries = [{"model": self.model, "name": self.served_model_name}]
            for entry in self.extra_model:
                name, _, source = entry.rpartition("=")
                entries.append({"model": source, "name": name or None})
            ids = [e["name"] or public_model_name(e["model"]) for e in entries]
            if self.lora_base is not None and self.lora_base not in ids:
                raise ValueError(f"--lora-base {self.lora_base!r} is none of the served models ({', '.join(ids)})")
            entries[ids.index(self.lora_base) if self.lora_base else 0]["loras"] = dict(
                entry.partition("=")[::2] for entry in self.lora
            )
        if len(entries) > 1:
            config = dataclasses.replace(config, gpu_memory_fraction=config.gpu_memory_fraction / len(entries),
                                         shared_gpu=True)  # fmt: skip
        specs = []
        for i, entry in enumerate(entries):
            source = entry["model"]
            ids = [entry.get("name") or public_model_name(source)]
            if i == 0:
                ids += [WHISPER_1, *self.model_alias]
            ids = list(dict.fromkeys([*ids, *entry.get("aliases", [])]))
            loras = tuple((entry.get("loras") or {}).items())
            model_config = dataclasses.replace(config, model=source, loras=loras)
            specs.append(ServedModelSpec(ids, source, model_config, entry.get("ttl_s")))
        return specs

    def api_keys(self) -> list[str]:
        """The accepted keys: --api-key plus the lines of --api-key-file."""
        keys = list(self.api_key)
        if self.api_key_file is not None:
            lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        return keys

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * MIB)

    @property
    def ws_max_message_bytes(self) -> int:
        """The largest WebSocket message the server reads (uvicorn's ws_max_size): a realtime append at OpenAI's
        limit; a larger one closes its connection (1009) before it is buffered whole."""
        return MAX_APPEND_BASE64 + WS_EVENT_ROOM

    @property
    def ws_max_queued_messages(self) -> int:
        """WebSocket messages read ahead of the app per connection (uvicorn's ws_max_queue): a session handles its
        events in order, so one waiting is enough, and each may be an append of ws_max_message_bytes."""
        return 1

    def engine_config(self) -> EngineConfig:
        """The engine's config: every EngineConfig field from the setting of the same name."""
        names = {f.name for f in dataclasses.fields(EngineConfig)} & set(type(self).model_fields)
        config = EngineConfig(**{name: getattr(self, name) for name in names})
        if self.batch_invariant:  # the flag is a kernel choice: --kernels '{"batch_invariant": true}' says the same
            config = dataclasses.replace(config, kernels=dataclasses.replace(config.kernels, batch_invariant=True))
        return config

    def engine_members(self) -> list[tuple[EngineConfig, int | None]]:
        """Each data parallel engine's config and GPU: on CUDA one GPU each (a shared GPU's memory fraction split
        between its engines), on a CPU an equal share of the cores this process may use."""
        from engine import resolve_device  # imports torch: only when engines start

        config, size = self.served_models()[0].config, self.data_parallel_size  # one model: its adapters too
        device = resolve_device("auto").type if config.device == "auto" else config.device  # named: no check here
        if device == "cuda":
            gpus = self.data_parallel_gpus or list(range(size))
            fraction = config.gpu_memory_fraction
            return [
                (
                    dataclasses.replace(
                        config, gpu_memory_fraction=fraction / gpus.count(g), shared_gpu=gpus.count(g) > 1
                    ),
                    g,
                )
                for g in gpus
            ]
        threads = config.num_threads or max(1, available_cpus() // size)
        return [(dataclasses.replace(config, num_threads=threads), None) for _ in range(size)]


def public_model_name(model: str) -> str:
    """`/srv/models/whisper-small` -> `whisper-small`, `large-v3.pt` -> `large-v3`; names and hub ids unchanged."""
    path = Path(model)
    if path.is_absolute() or model.startswith((".", "~")) or path.exists():
        name = path.stem if path.suffix in (".pt", ".bin", ".safetensors") else path.name
        return name or "whisper"
    return model
