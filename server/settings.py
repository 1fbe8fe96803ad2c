"""Settings: the one place that reads environment variables and CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.config import EngineConfig

MIB = 1024 * 1024


class Settings(BaseSettings):
    """Server and engine settings. Every field is also `--kebab-case` on the CLI and `WHISPER_UPPER_CASE` in the env."""

    model_config = SettingsConfigDict(env_prefix="WHISPER_", use_attribute_docstrings=True, extra="forbid")

    model: str = "tiny.en"
    """Model to load: a known name (tiny.en, base), a local directory or checkpoint, or a hub id."""
    host: str = "127.0.0.1"
    """Interface to bind the HTTP server to."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port of the HTTP server."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device to run the model on; auto picks cuda when available."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weight and activation dtype; auto is float32 on CPU and float16 on CUDA."""
    served_model_name: str | None = None
    """Model id listed by /v1/models and accepted in requests (default: --model); `whisper-1` is accepted too."""
    max_upload_mb: float = Field(default=25.0, gt=0)
    """Largest accepted audio upload, in MiB (OpenAI's limit is 25)."""
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
    """Greedy decode steps per launch while up to 8 windows decode and none waits (one CUDA graph replays them);
    a window's end is seen up to that many steps late. Default 4 on a GPU, 1 on a CPU."""
    seed: int = 0
    """Seed for sampling at temperature > 0 (requests are reproducible)."""
    fixed_decode_tokens: int | None = Field(default=None, ge=1)
    """Benchmarks only: decode exactly this many tokens per 30 s window (EOS ignored, no fallbacks)."""
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
    engine_process: Literal["auto", "on", "off"] = "auto"
    """Run the engine in a process of its own, so that the HTTP side does not share its GIL; auto: on when the
    engine runs on a GPU (where its loop's host work bounds throughput), off on a CPU."""

    @property
    def model_id(self) -> str:
        """The id clients use for this model."""
        return self.served_model_name or self.model

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * MIB)

    def engine_config(self) -> EngineConfig:
        """Build the engine's config from these settings."""
        return EngineConfig(
            model=self.model,
            dummy_weights=self.dummy_weights,
            tokenizer=self.tokenizer,
            max_encoder_batch=self.max_encoder_batch,
            max_audio_ctx=self.max_audio_ctx,
            max_text_ctx=self.max_text_ctx,
            stepwise_prompt_tokens=self.stepwise_prompt_tokens,
            overlap_steps=self.overlap_steps,
            multi_step=self.multi_step,
            cross_cache_dtype=self.cross_cache_dtype,
            encoder_precision=self.encoder_precision,
            device=self.device,
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            max_waiting=self.max_waiting,
            gpu_memory_fraction=self.gpu_memory_fraction,
            enforce_eager=self.enforce_eager,
            num_threads=self.num_threads,
            seed=self.seed,
            fixed_decode_tokens=self.fixed_decode_tokens,
        )
