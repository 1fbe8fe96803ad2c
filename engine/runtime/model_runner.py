"""ModelRunner: owns weights and caches; turns scheduled sequences into tensors and runs encoder, prefill, decode."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch
from torch import Tensor

from engine.audio.constants import N_FRAMES
from engine.audio.features import LogMelBuilder, LogMelSpectrogram, pad_or_trim
from engine.backends import DecodeBackend, select_backend
from engine.backends.cpu_int8_encoder import Int8Blocks
from engine.backends.cpu_memory import keep_freed_memory
from engine.config import EngineConfig
from engine.cpus import available_cpus
from engine.decoding import BeamSearch, RuleSetup, Sampler, StepContext, logits_processor
from engine.kernels import int8_attention
from engine.model.dims import DUMMY_DIMS
from engine.model.kv_cache import CacheShape, KVCache, plan_num_slots
from engine.model.lora import AdapterError, Adapters, product_names, with_adapters
from engine.model.tokenizer import Tokenizer
from engine.model.weights import Checkpoint, dummy_state_dict, load_checkpoint, resolve_model
from engine.model.whisper import Whisper, tiled_positions
from engine.runtime.cuda_graphs import GraphRunner
from engine.runtime.sequence import Sequence
from engine.runtime.step_io import StepInputs, StepOutput, host_state
from engine.transcription.alignment import AlignmentInput

log = logging.getLogger(__name__)

MAX_GPU_SLOTS = 512  # default cap on decode slots on a GPU; see ModelRunner._default_max_slots
MULTI_STEP_GPU = 4  # greedy steps per launch for a few windows on a GPU (EngineConfig.multi_step)
MULTI_STEP_MAX_ROWS = 32  # the most windows decoded several steps per launch
# A window's first timestamp is at most 1 s in (openai/whisper's and faster-whisper's max_initial_timestamp), in
# steps of 0.02 s
MAX_INITIAL_TIMESTAMP_INDEX = 50


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The activations' and float weights' type."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if name == "int8":
        if device.type != "cpu":
            raise ValueError(
                "dtype int8 is a CPU mode (int8 weights, float32 activations); on a GPU use float16 or bfloat16, "
                "where the cross-attention cache is int8 by default"
            )
        return torch.float32
    dtype = getattr(torch, name)
    if device.type == "cpu" and dtype == torch.float16:
        raise ValueError("float16 is not supported on CPU; use float32 or bfloat16")
    return dtype


def resolve_int8_weights(name: str, device: torch.device, quantization: str | None) -> bool:
    """Whether a CPU's products read int8 weights: asked for (dtype int8), or by default for an int8 checkpoint,
    whose weights are int8 already: computing with them as stored loses nothing that loading them did not (their
    integers come back exactly: tests/unit/test_cpu_kernels.py). Float checkpoints stay float32 unless asked,
    as quantizing them changes a word where two were nearly tied (tests/integration/test_cpu_int8.py)."""
    return device.type == "cpu" and (name == "int8" or (name == "auto" and quantization == "int8"))


def default_int8_cross(device: torch.device) -> bool:
    """The cross cache's type when the config says auto: int8 on a GPU, where its kernel makes a decode step read
    about half the bytes and more slots fit (`benchmarks/gpu_throughput.py --cross-cache-dtype model|int8`), and
    transcripts stayed the same (tests/integration/test_int8_cross_cache.py, tests/gpu/test_int8_cross_attention.py);
    the model's dtype on a CPU, which has no such kernel and would dequantize each layer's cache at every step, and
    on GPUs older than Ampere."""
    if device.type != "cuda" or int8_attention.triton is None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)  # the kernels read bfloat16 scales


class ModelRunner:
    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None):
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu":
            keep_freed_memory()
            # the cores this process may use (its affinity and its container's CPU quota), not the machine's
            torch.set_num_threads(config.num_threads or min(torch.get_num_threads(), available_cpus()))
        ckpt = checkpoint or self._load(config)
        self.dims = dims = ckpt.dims
        # A given or shipped tokenizer must fit as is; only dummy weights (benchmarks pass base's tokenizer for
        # large-v3 shapes) may have it extended to their language count, as the packaged fallback is.
        tokenizer_file = self._tokenizer_file(config.tokenizer) or ckpt.tokenizer_file
        self.tokenizer = (
            Tokenizer.for_model(tokenizer_file, dims, add_languages=config.dummy_weights)
            if tokenizer_file is not None
            else self._fallback_tokenizer(dims)
        )
        # CTranslate2's default when a checkpoint names none: every head of the last half of the decoder
        self.alignment_heads = ckpt.alignment_heads or [
            (layer, head) for layer in range(dims.n_text_layer // 2, dims.n_text_layer) for head in range(dims.n_text_head)
        ]
        cross = config.cross_cache_dtype
        int8_cross = cross == "int8" or (cross == "auto" and default_int8_cross(self.device))
        self.model = self._build_model(ckpt)
        kernels = config.kernels
        self.int8_weights = resolve_int8_weights(config.dtype, self.device, ckpt.quantization)
        if self.int8_weights:
            kernels = dataclasses.replace(kernels, cpu_int8_weights=True)
        # the implementation of a decode step on this device, chosen once; it lays the weights out for itself
        self.backend: DecodeBackend = select_backend(
            self.model, self.device, self.dtype, int8_cross, kernels, config.encoder_precision == "float8"
        )
        self.adapters = self._adapters(config)
        for name, folder in config.loras:
            self.load_adapter(name, folder)
        self.log_mel = LogMelSpectrogram(dims.n_mels, self.device)

        self.cache_shape = CacheShape.for_model(dims, config.max_audio_ctx, config.max_text_ctx)
        self.n_text_ctx = self.cache_shape.n_text_ctx
        self.vocab_size = dims.n_vocab
        self.num_slots, self.num_cross_slots, why = plan_num_slots(
            self.cache_shape, self.dtype, self.device, config.gpu_memory_fraction, self._activation_reserve(),
            int8_cross, config.max_num_seqs or self._default_max_slots(), rows_asked=bool(config.max_num_seqs),
            shared_gpu=config.shared_gpu,
        )  # fmt: skip
        log.info("memory plan: %d decode rows, %d cross slots (%s)", self.num_slots, self.num_cross_slots, why)
        self.cache = KVCache(
            self.cache_shape, self.num_slots, self.dtype, self.device, int8_cross, self.num_cross_slots
        )
        if self.adapters is not None:
            self.adapters.reserve_rows(self.num_slots)
        self.max_encoder_batch = min(self.num_slots, config.max_encoder_batch or (32 if self.on_gpu else 4))
        tok = self.tokenizer
        self.logits_processor = logits_processor(
            RuleSetup(
                tok,
                dims.n_vocab,
                self.device,
                suppress_tokens=ckpt.suppress_tokens or tok.default_suppress_tokens(),
                begin_suppress_tokens=ckpt.begin_suppress_tokens or [tok.encode(" ")[0], tok.eot],
                max_initial_timestamp_index=MAX_INITIAL_TIMESTAMP_INDEX,
            )
        )
        self.sample = Sampler(self.device, config.kernels.greedy_pick)
        self.beam_search = BeamSearch(dims.n_vocab, tok.eot, tok.timestamp_begin, self.n_text_ctx)
        self.io = StepInputs(self.device)
        self.multi_step = config.multi_step or (MULTI_STEP_GPU if self.on_gpu else 1)
        self.graphs: GraphRunner | None = None
        if self.on_gpu and not config.enforce_eager:
            self.graphs = GraphRunner(
                self.backend, self.cache, self.num_slots, self.max_encoder_batch, self.dtype, self.logits_processor,
                self.multi_step, config.kernels.greedy_pick,
            )  # fmt: skip
            self.graphs.capture()
        # where the kernels read whole cross slots, short contexts are tiled across them (encode_into_slots) once
        # each length has run here; else (a failure at start) they are encoded as full windows
        self.tiles_short_contexts = not self.backend.short_context and self._warm_tiled_lengths()
        if self.graphs is not None and self.tiles_short_contexts and config.short_context_graphs:
            self._capture_short_encoders()

    @torch.inference_mode()
    def _warm_tiled_lengths(self) -> bool:
        """One encoder pass at each tiled short context's length from a sixth of a window up (a partial decode of
        2 s of audio and its margin on), its copies written across cross slot 0 (no window holds it yet): the
        encoder's attention kernel is compiled per length, which would otherwise hold up the first partial decode
        of each length on a busy engine. False, logged, if one fails."""
        dims = self.model.dims
        try:
            for n in self._tiled_lengths():
                mel = torch.zeros(1, dims.n_mels, 2 * n, device=self.device, dtype=self.dtype)
                self.model.decoder.fill_cross_cache(self.backend.encode(mel), self.cache, [0], tile=True)
        except Exception:  # partials then cost full windows, which every backend runs
            log.warning("short contexts could not be tiled across cross slots here: full windows instead",
                        exc_info=True)  # fmt: skip
            return False
        finally:
            self.cache.set_cross_len(0, dims.n_audio_ctx)
        return True

    def _tiled_lengths(self) -> list[int]:
        """The encoder positions of the tiled short contexts warmed and captured: from a sixth of a window up (a
        partial decode of 2 s of audio and its margin on); shorter ones run eagerly."""
        ctx = self.model.dims.n_audio_ctx
        return [n for n in range(-(-ctx // 6), ctx) if ctx % n == 0]

    def _capture_short_encoders(self) -> None:
        """Graphs of the tiled lengths' encoder passes (GraphRunner.capture_short_encoders); if capture fails here,
        those passes run eagerly as before, logged."""
        try:
            self.graphs.capture_short_encoders([2 * n for n in self._tiled_lengths()])
        except Exception:  # an optimisation: the eager passes give the same features
            log.warning("short contexts' encoder graphs could not be captured: eager passes instead", exc_info=True)
            self.graphs.short_encoder_graphs.clear()

    def _adapters(self, config: EngineConfig) -> Adapters | None:
        """The LoRA adapters' bank where the config allows any, its deltas added to every product path of the
        backend (engine/model/lora.py); None otherwise, and nothing of it is on any path."""
        capacity = config.max_loras or len(config.loras)
        if not capacity:
            return None
        if config.encoder_precision == "float8":
            raise ValueError("LoRA adapters need the encoder in the model's precision (encoder_precision model)")
        names = product_names(self.model)  # after the backend laid the weights out
        groups = [n if isinstance(n, tuple) else (n,) for n in names.values()]
        adapters = Adapters(
            self.dims, capacity, self.dtype, self.device, groups, config.max_lora_rank, pdl=self.backend.kernels.pdl
        )
        if adapters.static:
            log.info("adapters: %d resident at most, rank %d at most: %.0f MiB of stacks", capacity,
                     config.max_lora_rank, adapters.nbytes / 2**20)  # fmt: skip
        encoder, decoder = self.model.encoder, self.model.decoder
        encoder.ops = with_adapters(encoder.ops, adapters, names)
        decoder.ops = with_adapters(decoder.ops, adapters, names)
        decoder.reference_ops = with_adapters(decoder.reference_ops, adapters, names)
        if isinstance(encoder.quantized, Int8Blocks):
            encoder.quantized.adapters = adapters
        self.backend.use_adapters(adapters, names)
        return adapters

    def load_adapter(self, name: str, folder: str) -> None:
        if self.adapters is None:
            raise AdapterError("this engine takes no adapters (its max_loras is 0)")
        adapter = self.adapters.add(name, folder)
        log.info("adapter %s: rank %d on %d products (%.1f MiB)", name, adapter.rank, len(adapter.weights),
                 adapter.nbytes / 2**20)  # fmt: skip

    def remove_adapter(self, name: str) -> None:
        if self.adapters is None or name not in self.adapters.indices:
            raise AdapterError(f"the adapter {name!r} is not loaded")
        self.adapters.remove(name)

    def adapter_names(self) -> frozenset[str]:
        return frozenset(self.adapters.indices) if self.adapters is not None else frozenset()

    def use_adapters(self, names: list[str | None]) -> None:
        """The adapter of each row of the passes that follow, by name (None: the base model)."""
        if self.adapters is not None:
            self.adapters.use([self.adapters.index(name) for name in names])

    def _load(self, config: EngineConfig) -> Checkpoint:
        if not config.dummy_weights:
            return load_checkpoint(config.model)
        if config.model not in DUMMY_DIMS:
            raise ValueError(f"dummy weights need a size name, one of {sorted(DUMMY_DIMS)}; got {config.model!r}")
        dims = DUMMY_DIMS[config.model]
        # made on the target device in the target dtype: large sizes take seconds on a GPU, minutes on a CPU
        state = dummy_state_dict(dims, dtype=self.dtype, device=self.device)
        return Checkpoint(dims, state, None, None, None, None, "dummy")

    @staticmethod
    def _tokenizer_file(path: str | None) -> Path | None:
        if path is None:
            return None
        p = Path(path)
        return p / "tokenizer.json" if p.is_dir() else p

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @staticmethod
    def _fallback_tokenizer(dims) -> Tokenizer:
        """Weights without a tokenizer (an OpenAI .pt, dummy weights): the packaged one of the same vocabulary.

        English-only checkpoints share tiny.en's; tiny to large-v2 share base's; large-v3's is base's with <|yue|>
        added and the later ids shifted, which is exactly how openai/whisper builds it (add_language_tokens). Any
        other vocabulary fails the fit check with the tokenizer to pass."""
        resolved = resolve_model("base" if dims.is_multilingual else "tiny.en")
        assert resolved.config_dir is not None
        return Tokenizer.for_model(resolved.config_dir / "tokenizer.json", dims, add_languages=True)

    def _build_model(self, ckpt: Checkpoint) -> Whisper:
        with torch.device("meta"):
            model = Whisper(ckpt.dims)
        model.load_state_dict(ckpt.state_dict, strict=True, assign=True)
        return model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)

    def _default_max_slots(self) -> int:
        """Slots when max_num_seqs is not set, however many more the memory plan would allow. A CPU is saturated
        long before 32 sequences. On a GPU a decode step of 512 rows is past the point where its weight reads
        dominate, and a small decoder (large-v3-turbo with the int8 cross cache: ~6,000 slots on an H200) must
        not get a decode batch whose logits alone outgrow the activation reserve."""
        return MAX_GPU_SLOTS if self.on_gpu else 32

    def _activation_reserve(self) -> int:
        """Bytes kept free for activations: one encoder batch plus the logits of the largest decode batch,
        generously rounded up."""
        d = self.dims
        elem = torch.empty((), dtype=self.dtype).element_size()
        max_encoder_batch = self.config.max_encoder_batch or 32
        encoder = max_encoder_batch * d.n_audio_ctx * d.n_audio_state * elem * 12  # MLP is 4x wide, x2 buffers
        rows = self.config.max_num_seqs or self._default_max_slots()
        logits = rows * d.n_vocab * 4 * 4  # float32 logits, the model-dtype product and the rules' temporaries
        return int(encoder + logits + 512 * 2**20)

    # ---- features and encoder -------------------------------------------------------------------

    def mel(self, audio: Tensor) -> Tensor:
        """Whole-audio log-mel (n_mels, frames); windows are cut from it so the clamp spans the audio."""
        return self.log_mel(audio.to(self.device))

    def log_mel_builder(self, audio: Tensor) -> LogMelBuilder:
        """The same log-mel as `mel`, computed a window's worth of frames per step (the engine loop interleaves
        the steps with decoding)."""
        return LogMelBuilder(self.log_mel, audio, piece_frames=N_FRAMES)

    @torch.inference_mode()
    def encode_into_slots(
        self, mels: list[Tensor], cross_slots: list[int], adapters: list[str | None] | None = None
    ) -> None:
        """Run the encoder on a batch of windows and write their cross-attention K/V into their cross slots. A
        window's mel has N_FRAMES frames, or fewer for a short context (DecodeOptions.context_margin_s): those are
        encoded in passes of one length each. Where the backend's kernels read whole cross slots, a short context
        is padded to the fewest positions whose copies fill a slot (a few lengths: tiled_positions), and the
        copies fill it (fill_cross_cache). `adapters`: each window's LoRA adapter (None: the base model's)."""
        adapters = adapters or [None] * len(mels)
        tile = self.tiles_short_contexts
        if tile:
            mels = [self._tiled_mel(mel) for mel in mels]
        elif not self.backend.short_context:
            mels = [pad_or_trim(mel, N_FRAMES) for mel in mels]  # a full window is returned as it is
        passes: dict[tuple[int, str | None], list[int]] = {}
        for i, mel in enumerate(mels):
            passes.setdefault((mel.shape[-1], adapters[i]), []).append(i)
        passes = self._adapter_passes(passes, adapters)
        for group in passes.values():
            batch = torch.stack([mels[i] for i in group]).to(device=self.device, dtype=self.dtype)
            self.use_adapters([adapters[i] for i in group])
            graph = self.graphs and not self.backend.adapted  # captured without adapters
            encode = self.graphs.encode if graph else self.backend.encode
            self.model.decoder.fill_cross_cache(encode(batch), self.cache, [cross_slots[i] for i in group], tile)

    def _tiled_mel(self, mel: Tensor) -> Tensor:
        """A short context's mel padded as its margin is (pad_or_trim) to the frames of tiled_positions; a full
        window as it is."""
        frames = mel.shape[-1]
        if frames >= N_FRAMES:
            return mel
        return pad_or_trim(mel, 2 * tiled_positions(frames // 2, self.model.dims.n_audio_ctx))

    def _adapter_passes(
        self, passes: dict[tuple[int, str | None], list[int]], adapters: list[str | None]
    ) -> dict[tuple, list[int]]:
        """The encoder's passes from the windows of each (length, adapter): on a GPU, the base model's windows get
        a pass of their own (it replays its graph) and every adapter's share one, ordered by adapter, whose products
        run each adapter's windows on its weights merged in (engine/model/lora.py Adapters.merged_runs; a pass of
        one adapter's, Adapters.merged): a pass per adapter would launch the whole encoder again for a few windows,
        where only the products need their own. Elsewhere one pass per length."""
        by_adapter = self.on_gpu and self.adapters is not None
        out: dict[tuple, list[int]] = {}
        for (frames, adapter), group in passes.items():
            kind = "(adapters)" if by_adapter and adapter is not None else None
            out.setdefault((frames, kind), []).extend(group)
        return {key: sorted(group, key=lambda i: (adapters[i] or "", i)) for key, group in out.items()}

    def admissible_encoder_batch(self, n: int) -> int:
        return self.graphs.admissible_encoder_batch(n) if self.graphs else n

    # ---- decoder ----------------------------------------------------------------------------------

    def admit(self, seqs: list[Sequence]) -> None:
        """New rows: each logit rule makes its state for them, and a window's rows decoded with beam search (side by
        side, one cross slot) become its beams."""
        for seq in seqs:
            self.logits_processor.admit(seq)
        self.beam_search.admit(seqs)

    def prompt_graph_fits(self, seqs: list[Sequence]) -> bool:
        """Whether prefill(seqs) replays a graph (GraphRunner.prefill_fits): no adapter, a few new sequences whose
        rows end before the graph's, prompts no longer than the longest captured."""
        adapted = self.adapters is not None and any(s.job.options.adapter for s in seqs)
        return (
            self.graphs is not None and not adapted
            and self.graphs.prefill_fits(seqs[0].slot, len(seqs), max(len(s.pending) for s in seqs))
        )  # fmt: skip

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> tuple[list[int], list[float]]:
        """Feed each new sequence its whole prompt (right-padded); sample each one's first output (waits for it)."""
        slot_start = seqs[0].slot
        self.map_rows(seqs)
        lengths = [len(s.pending) for s in seqs]
        width = max(lengths)
        rows = [s.pending + [self.tokenizer.eot] * (width - len(s.pending)) for s in seqs]
        tokens = self.io.to_device(rows)
        # each prompt's last token (the first sampled token's logits) and its <|sot|> (the no-speech probability)
        index = self.io.to_device([[n - 1 for n in lengths], [s.pending.index(self.tokenizer.sot) for s in seqs]])
        if self.prompt_graph_fits(seqs):
            logits, sot_logits = self.graphs.prefill(tokens, index, slot_start, [s.cross_slot for s in seqs])
        else:
            hidden = self.backend.prompt_pass(tokens, self.cache, slot_start)
            batch = torch.arange(len(seqs), device=self.device)
            logits = self.backend.logits(hidden[batch, index[0]])
            sot_logits = self.backend.logits(hidden[batch, index[1]])
        no_speech = sot_logits.softmax(dim=-1)[:, self.tokenizer.no_speech]
        timestamps = any(s.job.with_timestamps for s in seqs)
        state = self.io.to_device([host_state(s) for s in seqs]) if timestamps else None
        return self._sample(seqs, logits, state, no_speech, list(range(len(seqs)))).result()

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], keep: bool = False) -> StepOutput:
        """Launch one token for every running sequence (seqs[i] lives in slot i); the output is read later.
        `keep`: the next step may be launched before this one is read, so keep its tokens and rule state.

        A sequence whose next token the host does not know yet (ON_DEVICE: the previous step sampled it and its
        result has not been read) takes it from that step's output on the device, and likewise the state its
        timestamp rules need; everything else comes from the host in one copy."""
        self.map_rows(seqs)
        tokens, positions, state, _ = self.io.build(seqs)
        tokens = tokens[:, None]
        kv_len = max(s.num_cached for s in seqs) + 1
        logits = self.graphs.decode(tokens, positions, kv_len) if self.graphs else None
        if logits is None:
            logits = self._eager_logits(seqs, tokens, positions)
        # A window whose prompt is fed step by step has just been given <|startoftranscript|>: its no-speech
        # probability comes from these logits (prefill takes it from that position), before the rules edit them.
        sot = self.tokenizer.sot
        sot_rows = [i for i, s in enumerate(seqs) if s.pending[0] == sot and s.num_cached < len(s.job.prompt)]
        no_speech = None
        if sot_rows:
            no_speech = logits[self.io.to_device(sot_rows)].softmax(dim=-1)[:, self.tokenizer.no_speech]
        # built while the GPU runs the step (the copies do not wait for it); the rules edit the logits in place,
        # and a graph's logits buffer is rewritten by the next replay anyway
        return self._sample(seqs, logits, state, no_speech, sot_rows, keep)

    def _eager_logits(self, seqs: list[Sequence], tokens: Tensor, positions: Tensor, ahead: int = 0) -> Tensor:
        """A step's logits without a graph; `ahead`: the step is that many positions past each sequence's cached
        count (multi-step decoding)."""
        return self.backend.eager_logits(tokens, positions, self.cache, [s.num_cached + ahead for s in seqs])

    def map_rows(self, seqs: list[Sequence]) -> None:
        """The launch's rows (seqs[i] in row seqs[0].slot + i) to their windows' cross slots."""
        self.cache.map_rows(seqs[0].slot, [s.cross_slot for s in seqs])
        if self.adapters is not None:
            self.use_adapters([s.job.options.adapter for s in seqs])

    def no_multi_step(self, seqs: list[Sequence]) -> str | None:
        """What keeps `seqs` from several steps in one launch, or None: they must be a few rows that a graph (or
        eager steps) serves, every one sampling greedily past its first token, none decided by the host, all within
        the context for that many steps, and no fixed token count ending inside them (windows with and without
        timestamps may share a launch). Engine counts each reason (/metrics:
        `whisper_engine_total{name="single_steps_..."}`)."""
        k = self.multi_step
        if len(seqs) > MULTI_STEP_MAX_ROWS:  # checked first: a large batch's every step asks
            return "rows"
        if self.graphs is not None and self.graphs.multi_size_for(len(seqs)) is None:
            return "rows"
        for s in seqs:
            job = s.job
            if not s.sampling or s.num_launched == 0:
                return "first_token"
            if job.temperature > 0:
                return "temperature"
            if s.host_bound:  # the host decides each next token
                return "host_bound"
            if s.num_cached + k > self.n_text_ctx:
                return "context"
            if s.ends_within(k):
                return "fixed_count"
        return None

    @torch.inference_mode()
    def decode_multi(self, seqs: list[Sequence], keep: bool = False) -> StepOutput:
        """multi_step greedy steps in one launch for `seqs` (seqs[i] in slot i; no_multi_step found nothing in the
        way), each step's token (and with timestamps its rule state) fed to the next on the device: a graph replays
        them on a GPU. The output holds every step's tokens and log-probabilities, step by step (row order within a
        step); with `keep` the last step's tokens and rule state stay on the device for the next launch."""
        k = self.multi_step
        self.map_rows(seqs)
        # the state is every row's, or None while no row decodes with timestamps; where some do, the rules edit
        # only their rows (the extra column `stamped`), so windows with and without timestamps share a launch
        with_ts = [s.job.with_timestamps for s in seqs]
        extra = [[int(s.must_not_end), int(t)] for s, t in zip(seqs, with_ts)]
        tokens, positions, state, h = self.io.build(seqs, extra)
        no_eot = h[:, -2] > 0
        stamped = h[:, -1] > 0 if any(with_ts) and not all(with_ts) else None  # None: the rules on every row or none
        if self.graphs is not None:
            step_tokens, step_logprobs, state = self.graphs.decode_multi(
                tokens[:, None], positions, no_eot, state, stamped
            )
        else:
            processor, step_tokens, step_logprobs = self.logits_processor, [], []
            greedy = ([0.0] * len(seqs), [None] * len(seqs))
            for j in range(k):
                logits = self._eager_logits(seqs, tokens[:, None], positions + j, ahead=j)
                logits = processor.plain(logits, no_eot, state, stamped)
                tokens, logprobs = self.sample(logits, *greedy)
                state = None if state is None else processor.next_state(state, tokens)
                step_tokens.append(tokens)
                step_logprobs.append(logprobs)
            step_tokens, step_logprobs = torch.stack(step_tokens), torch.stack(step_logprobs)
        if keep:
            self.io.keep(step_tokens[-1], state)
        values = torch.cat([step_tokens.flatten().double(), step_logprobs.flatten().double()])
        return StepOutput(values, k * len(seqs))

    def reset_steps(self) -> None:
        """Forget the last step's device outputs (after a failed step: no sequence may take its tokens)."""
        self.io.reset()

    @torch.inference_mode()
    def align(self, seq: Sequence, text: list[int], language: str, task: str, num_frames: int) -> AlignmentInput:
        """Alignment-head cross-attention for a finished window's text tokens, read from its slot."""
        tok = self.tokenizer
        prompt = tok.sot_sequence(language, task)
        tokens = torch.tensor([prompt + [tok.no_timestamps] + text + [tok.eot]], device=self.device)
        self.use_adapters([seq.job.options.adapter])
        qk, hidden = self.model.decoder.align(tokens, self.cache, seq.cross_slot, self.alignment_heads)
        logits = self.backend.logits(hidden)
        # probability of each text token given the ones before it (rows from <|notimestamps|> on)
        probs = logits[len(prompt) : len(prompt) + len(text), : tok.eot].float().softmax(dim=-1)
        token_probs = probs[torch.arange(len(text)), torch.tensor(text, dtype=torch.long)].tolist() if text else []
        return AlignmentInput(text, qk.float().cpu(), token_probs, num_frames, len(prompt), language)

    def _sample(
        self, seqs: list[Sequence], logits: Tensor, state: Tensor | None, no_speech: Tensor | None,
        no_speech_rows: list[int], keep: bool = False,
    ) -> StepOutput:  # fmt: skip
        """Rules and sampling, queued on the device; the tokens, their log-probabilities, the no-speech probabilities
        of `no_speech_rows` and the beam groups' candidates go to the host in one copy that nothing waits for yet.
        With `keep` the sampled tokens and the updated rule state stay on the device for the next step (`decode`)."""
        processor = self.logits_processor
        logits = processor(logits, processor.prepare(seqs, StepContext(self.io.to_device, state)))
        temps = [s.job.temperature if s.sampling else 0.0 for s in seqs]
        gens = [s.job.generator if t > 0 else None for s, t in zip(seqs, temps)]
        tokens, logprobs = self.sample(logits, temps, gens)
        if keep:
            sampled = [i for i, s in enumerate(seqs) if s.sampling]  # rows whose token joins the sequence
            if state is not None and sampled:  # a sampled token becomes the last one; a timestamp the last timestamp
                every = len(sampled) == len(seqs)
                rows = None if every else self.io.to_device(sampled)
                new = processor.next_state(*((state, tokens) if every else (state[rows], tokens[rows])))
                state = new if every else state.index_copy(0, rows, new)
            self.io.keep(tokens, state)
        parts = [tokens.double(), logprobs.double()]
        extras = []
        if no_speech is not None:
            parts.append(no_speech.double())
            extras.append((len(no_speech_rows), no_speech_reader([seqs[i] for i in no_speech_rows])))
        ranked = self.beam_search.rank(logits, seqs, self.io.to_device)  # their rows' sampled tokens are not used
        if ranked is not None:
            parts.append(ranked[0])
            extras.append((len(ranked[0]), ranked[1]))
        return StepOutput(torch.cat(parts), len(seqs), extras)


def no_speech_reader(seqs: list[Sequence]):
    """What sets each of `seqs`' no-speech probability once the step is read."""

    def read(values: list[float]) -> None:
        for seq, p in zip(seqs, values):
            seq.no_speech_prob = p

    return read
