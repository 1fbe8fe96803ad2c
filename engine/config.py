"""EngineConfig: everything the engine needs to start, validated once."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kernels.options import KernelOptions

DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
DEVICES = ("auto", "cpu", "cuda")
CROSS_CACHE_DTYPES = ("auto", "model", "int8")
ENCODER_PRECISIONS = ("model", "float8")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "tiny.en"  # a known name (tiny.en, base), a local path, or a hub id
    dummy_weights: bool = False  # random weights at the named size (benchmarks without downloads)
    tokenizer: str | None = None  # tokenizer.json (or its folder) when the weights carry none
    device: str = "auto"
    # auto = float16 on CUDA; on a CPU, int8 for an int8 checkpoint (its weights are int8 already) and float32 for
    # others. int8 (CPU only): the products read int8 weights with a scale per output row, CTranslate2's scheme, and
    # the activations stay float32 (model_runner.resolve_int8_weights).
    dtype: str = "auto"
    max_num_seqs: int | None = None  # decode slots; None = from the memory plan
    max_waiting: int = 256  # requests admitted but not yet decoding; beyond this submit refuses (backpressure)
    # Tokens a request may sample, fallback retries included, per 30 s of its audio (DecodeOptions can lower it).
    # Whisper samples at most n_text_ctx // 2 = 224 per attempt: the default allows every window a full attempt
    # and a full retry, while a prompt that derails every window through the whole temperature ladder (six
    # attempts to the context limit) is stopped after about two.
    decode_budget_per_window: int = 448
    # windows encoded per step (bounds the stall of running decodes); None = 4 on CPU, 32 on GPU
    max_encoder_batch: int | None = None
    max_audio_ctx: int | None = None  # cross-attention cache length; None = the encoder's own (1500)
    max_text_ctx: int | None = None  # self-attention cache length; None = the decoder's own (448)
    gpu_memory_fraction: float = 0.9
    # Other engines share this GPU (data parallel): gpu_memory_fraction counts this process's memory only
    # (kv_cache.plan_num_slots).
    shared_gpu: bool = False
    enforce_eager: bool = False  # no CUDA graphs
    num_threads: int | None = None  # CPU intra-op threads; None = torch's default
    # The sampling seed of requests that give none (DecodeOptions.seed): temperature-fallback draws then depend only
    # on this seed and the request's own audio, never on what else the engine decodes.
    seed: int = 0
    # A new window whose prompt has at most this many tokens gets it one token per decode step, riding along with
    # the running batch (in its CUDA graph), instead of an eager prefill pass of its own, while the batch is small
    # (engine.STEPWISE_MAX_RUNNING). None = 8 on a GPU, where that pass launches hundreds of kernels one by one, the
    # time of several graph-replayed steps (`benchmarks/gpu_throughput.py --stepwise-prompt-tokens 0` against the
    # default); 0 (always prefill) on a CPU, where a prefill costs about two steps and matches faster-whisper's
    # numbers.
    stepwise_prompt_tokens: int | None = None
    # The cross-attention cache's element type: "model" (the weights' dtype), or "int8" with a bfloat16 scale per
    # vector (engine/kernels/int8_attention.py: about half the bytes a decode step reads).
    # auto = model_runner.default_int8_cross.
    cross_cache_dtype: str = "auto"
    # The encoder's products: in the model's dtype, or "float8" (e4m3 with a scale per row; engine/kernels/fp8.py):
    # faster on GPUs with FP8 tensor cores, at some cost in precision, so opt-in.
    encoder_precision: str = "model"
    # While other requests decode, a background window (DecodeOptions.background: a live preview) is admitted only
    # once they have decoded this many times as long as the last admission took (its encoder pass and prompt pass,
    # which wait for the GPU): admissions then take at most 1 / (1 + pace) of the loop from them, and the previews
    # that waited meanwhile are encoded together. 1: paced as a continuing window is.
    background_pace: float = 1.0
    # CUDA graphs for the encoder passes of short contexts tiled across cross slots (live previews), a few windows a
    # pass at each tiled length (GraphRunner.capture_short_encoders); off: those passes run eagerly (an A/B:
    # benchmarks/realtime_sessions.py, a partial decode's launch to its delta).
    short_context_graphs: bool = True
    # Launch each decode step before reading the previous one's tokens (engine.Engine.step). None = on a GPU only.
    overlap_steps: bool | None = None
    # Decode steps per launch while up to 32 windows decode greedily and none waits: one CUDA graph replays
    # them, each step's token and timestamp-rule state fed to the next on the device, so the host's work per step
    # (which bounds a small decoder such as large-v3-turbo's) is paid once per launch; a window that ends is seen up
    # to this many steps late. None = 4 on a GPU, 1 on a CPU (whose steps are bound by compute, not the host).
    multi_step: int | None = None
    # Which kernels the backends use (engine/kernels/options.py); the defaults are the fastest measured.
    kernels: KernelOptions = field(default_factory=KernelOptions)
    # LoRA adapters (PEFT directories) loaded at start, (name, folder) each; requests name one in
    # DecodeOptions.adapter, and rows of different adapters decode in the same batch (engine/model/lora.py)
    loras: tuple[tuple[str, str], ...] = ()
    # The most adapters resident at once, those above included (adapters added at run time count); 0: as many
    # as `loras` holds
    max_loras: int = 0
    # The largest rank an adapter may have on a GPU, where every resident adapter's matrices are laid out at this
    # rank for the decode graphs (memory: about 2 x rank x the model's product widths per adapter); at most 64
    max_lora_rank: int = 64

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.cross_cache_dtype not in CROSS_CACHE_DTYPES:
            raise ValueError(f"cross_cache_dtype must be one of {CROSS_CACHE_DTYPES}, got {self.cross_cache_dtype!r}")
        if self.encoder_precision not in ENCODER_PRECISIONS:
            raise ValueError(f"encoder_precision must be one of {ENCODER_PRECISIONS}, got {self.encoder_precision!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_encoder_batch is not None and self.max_encoder_batch < 1:
            raise ValueError(f"max_encoder_batch must be >= 1, got {self.max_encoder_batch}")
        if self.decode_budget_per_window < 1:
            raise ValueError(f"decode_budget_per_window must be >= 1, got {self.decode_budget_per_window}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.stepwise_prompt_tokens is not None and self.stepwise_prompt_tokens < 0:
            raise ValueError(f"stepwise_prompt_tokens must be >= 0, got {self.stepwise_prompt_tokens}")
        if self.background_pace < 1.0:
            raise ValueError(f"background_pace must be >= 1, got {self.background_pace}")
        if self.multi_step is not None and self.multi_step < 1:
            raise ValueError(f"multi_step must be >= 1, got {self.multi_step}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_loras < 0 or (self.max_loras and len(self.loras) > self.max_loras):
            raise ValueError(
                f"max_loras must be >= 0 and hold the {len(self.loras)} adapters given, got {self.max_loras}"
            )
        if not 1 <= self.max_lora_rank <= 64:
            raise ValueError(f"max_lora_rank must be in [1, 64], got {self.max_lora_rank}")
        if len({name for name, _ in self.loras}) != len(self.loras):
            raise ValueError("each adapter needs a name of its own")
