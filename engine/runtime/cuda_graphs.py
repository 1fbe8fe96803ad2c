"""CUDA graphs: the encoder keyed on batch size, the one-token decoder step keyed on (batch, context) buckets, the
prompt pass of a few new windows keyed on (batch, prompt length), and several greedy steps of a few windows in one
replay (multi-step decoding)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.audio.constants import N_FRAMES
from engine.backends import KV_BUCKET, DecodeBackend
from engine.decoding import LogitsProcessor, Sampler
from engine.model.kv_cache import KVCache

log = logging.getLogger(__name__)

DECODE_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
ENCODER_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
MAX_ENCODER_PADDING = 0.25  # pad a batch up to a captured size only while padding stays under this share
# Prompt passes with a graph: a few windows admitted together, their prompts right-padded to a captured length.
# [sot] [lang task] [notimestamps] is 2-4 tokens; a live preview's prompt carries the words its turn has sent, and a
# window may carry the text before it. Eagerly such a pass launches hundreds of kernels one by one, the time of
# several graph-replayed steps; fed one token per graph-replayed step it costs a step per token; replayed, it is one
# pass for the whole prompt: a lone window's time to first token (the TTFT column of `benchmarks/gpu_throughput.py
# --concurrency 1`), and the host time of every admission beside running windows (live previews come by the
# dozen a second: `benchmarks/realtime_sessions.py`, a partial decode's launch to its delta).
PREFILL_TOKENS = (2, 3, 4, 8, 16, 32, 64, 128, 256)
PREFILL_BATCH_BUCKETS = (1, 2, 4, 8)
# Short contexts tiled across cross slots (live previews: ModelRunner.encode_into_slots) come a few at a time, each
# pass at one of a few lengths; eagerly a pass launches the encoder's kernels one by one, hundreds of them
SHORT_ENCODER_BATCH_BUCKETS = (1, 2, 4, 8)
# Batches with a multi-step graph: up to a few dozen windows, where the host's per-launch work still bounds a step
# (large-v3-turbo with timestamps on an H100: 32 windows 1.13x as fast as with a step per launch; BENCHMARKS.md)
MULTI_STEP_BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32)
# A multi-step graph's timestamp rules: on no row, every row, or some rows (a per-row flag gives the others back
# their logits; a graph of its own, so launches without the mix pay nothing for it)
STAMPED = ("none", "every", "some")


def buckets_up_to(candidates: tuple[int, ...], limit: int) -> list[int]:
    sizes = [b for b in candidates if b < limit]
    return sizes + [limit]


@dataclass(slots=True)
class DecoderBuffers:
    """Static inputs and outputs the decoder graphs read and write (mini-sglang's capture buffer)."""

    tokens: Tensor  # (max_bs, 1) int64
    positions: Tensor  # (max_bs, 1) int64
    logits: Tensor  # (max_bs, n_vocab) float32
    prompt: Tensor  # (max prefill batch, max prompt length) int64: a prompt pass's tokens
    prompt_index: Tensor  # (3, max prefill batch) int64: each row, its prompt's last token and its <|sot|>
    prompt_logits: Tensor  # (2, max prefill batch, n_vocab) float32: at each prompt's last token and at its sot
    no_eot: Tensor  # (max multi-step batch,) bool: rows whose multi-step steps must not end (fixed token counts)
    multi_tokens: Tensor  # (steps, max multi-step batch) int64: each step's greedy tokens
    multi_logprobs: Tensor  # (steps, max multi-step batch) float32: their log-probabilities
    multi_state: Tensor  # (max multi-step batch, 3) int64: the timestamp rules' state, updated at every step
    multi_stamped: Tensor  # (max multi-step batch,) bool: rows the timestamp rules apply to


@dataclass(slots=True)
class EncoderBuffers:
    mel: Tensor  # (max_bs, n_mels, N_FRAMES) model dtype
    features: Tensor  # (max_bs, n_audio_ctx, n_audio_state) model dtype


@dataclass(slots=True)
class GraphStats:
    encoder_replays: int = 0
    encoder_eager: int = 0
    decoder_replays: int = 0
    decoder_eager: int = 0
    prefill_replays: int = 0
    multi_step_replays: int = 0
    encoder_padded_windows: int = 0


class GraphRunner:
    """Captures at start-up; replays copy inputs into static buffers, pad to the bucket and slice the outputs."""

    def __init__(
        self, backend: DecodeBackend, cache: KVCache, num_slots: int, max_encoder_batch: int, dtype: torch.dtype,
        processor: LogitsProcessor | None = None, multi_steps: int = 1, greedy_kernel: bool = True,
    ):  # fmt: skip
        self.backend = backend
        # With LoRA adapters the decoder's graphs are captured twice: as they are, and with the adapters' kernels
        # (engine/kernels/lora.py), which a step replays when one of its rows uses an adapter.
        self.adapters = backend.adapters
        self.model = model = backend.model
        self.processor = processor
        self.cache = cache
        self.device = cache.self_k.device
        self.sample = Sampler(self.device, greedy_kernel)
        dims = model.dims
        self.decode_sizes = buckets_up_to(DECODE_BATCH_BUCKETS, num_slots)
        self.encoder_sizes = buckets_up_to(ENCODER_BATCH_BUCKETS, min(max_encoder_batch, num_slots))
        n_ctx = cache.shape.n_text_ctx
        # Where a step's rows read their own prefix whatever the context (the backend's step kernel), one graph per
        # batch size serves every context (19 captures instead of 133 for large-v3's 448 positions).
        self.step_kernel = backend.reads_own_prefix
        if self.step_kernel:
            self.kv_sizes = [n_ctx]
        else:
            self.kv_sizes = sorted({min(k, n_ctx) for k in range(KV_BUCKET, n_ctx + KV_BUCKET, KV_BUCKET)})
        max_bs = self.decode_sizes[-1]
        self.prefill_sizes = [b for b in PREFILL_BATCH_BUCKETS if b <= num_slots]
        self.prefill_tokens = [t for t in PREFILL_TOKENS if t <= n_ctx]
        # The rows a prompt graph writes: the last ones, free unless the batch is nearly full. New windows take the
        # rows after the running ones, wherever those end; their prompts' keys and values are copied there after.
        max_pb = self.prefill_sizes[-1]
        self.prompt_row = max(0, num_slots - max_pb)
        # several steps per replay need the step kernel (each row attends its own prefix, whatever its position)
        self.multi_steps = multi_steps if processor is not None and self.step_kernel else 1
        self.multi_sizes = [b for b in MULTI_STEP_BATCH_BUCKETS if b <= num_slots] if self.multi_steps > 1 else []
        max_mb = max(self.multi_sizes, default=1)
        dev = self.device
        self.dec = DecoderBuffers(
            tokens=torch.zeros(max_bs, 1, dtype=torch.long, device=dev),
            positions=torch.zeros(max_bs, 1, dtype=torch.long, device=dev),
            logits=torch.zeros(max_bs, dims.n_vocab, dtype=torch.float32, device=dev),
            prompt=torch.zeros(max_pb, max(self.prefill_tokens), dtype=torch.long, device=dev),
            prompt_index=torch.zeros(3, max_pb, dtype=torch.long, device=dev),
            prompt_logits=torch.zeros(2, max_pb, dims.n_vocab, dtype=torch.float32, device=dev),
            no_eot=torch.zeros(max_mb, dtype=torch.bool, device=dev),
            multi_tokens=torch.zeros(self.multi_steps, max_mb, dtype=torch.long, device=dev),
            multi_logprobs=torch.zeros(self.multi_steps, max_mb, dtype=torch.float32, device=dev),
            multi_state=torch.zeros(max_mb, 3, dtype=torch.long, device=dev),
            multi_stamped=torch.zeros(max_mb, dtype=torch.bool, device=dev),
        )
        self.dec.prompt_index[0] = torch.arange(max_pb, device=dev)  # the batch rows the other two index into
        max_enc = self.encoder_sizes[-1]
        self.enc = EncoderBuffers(
            mel=torch.zeros(max_enc, dims.n_mels, N_FRAMES, dtype=dtype, device=dev),
            features=torch.zeros(max_enc, dims.n_audio_ctx, dims.n_audio_state, dtype=dtype, device=dev),
        )
        self.decoder_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.multi_graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}  # (batch, timestamp rows: STAMPED)
        self.adapted_decoder_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.adapted_multi_graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
        self.encoder_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.short_encoder_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (batch, mel frames)
        self.pool = None  # the memory pool every graph shares (capture)
        self.stats = GraphStats()

    # ---- capture ----------------------------------------------------------------------------------

    def _decode_step(self, bs: int, kv_len: int) -> None:
        hidden = self.backend.decode_step(self.dec.tokens[:bs], self.dec.positions[:bs], self.cache, kv_len)
        self.backend.logits(hidden[:, -1], out=self.dec.logits[:bs])

    def _prefill(self, bs: int, width: int) -> None:
        """The prompt pass of bs rows in slots prompt_row.., prompts of up to `width` tokens from position 0: logits
        at each prompt's last token (the first sampled token) and at its <|startoftranscript|> (the no-speech
        probability), where prompt_index says."""
        hidden = self.backend.prompt_pass(self.dec.prompt[:bs, :width], self.cache, self.prompt_row)
        rows, last, sot = self.dec.prompt_index[:, :bs]
        self.backend.logits(hidden[rows, last], out=self.dec.prompt_logits[0, :bs])
        self.backend.logits(hidden[rows, sot], out=self.dec.prompt_logits[1, :bs])

    def _multi_step(self, bs: int, stamped: str) -> None:
        """multi_steps greedy steps of rows 0..bs-1: each step's logits get the rules (LogitsProcessor.plain, with
        the timestamp rules from multi_state on `stamped` rows: none, every one, or some, those multi_stamped
        marks), its token and log-probability are kept, and the token, the next position and the updated rule state
        become the next step's input."""
        timestamps = stamped != "none"
        state = self.dec.multi_state[:bs]
        rules = {"none": (), "every": (state,), "some": (state, self.dec.multi_stamped[:bs])}[stamped]
        for j in range(self.multi_steps):
            self._decode_step(bs, self.kv_sizes[-1])
            logits = self.processor.plain(self.dec.logits[:bs], self.dec.no_eot[:bs], *rules)
            tokens, logprobs = self.sample(logits, [0.0] * bs, [None] * bs)
            self.dec.multi_tokens[j, :bs] = tokens
            self.dec.multi_logprobs[j, :bs] = logprobs
            self.dec.tokens[:bs, 0] = tokens
            self.dec.positions[:bs] += 1
            if timestamps:
                state.copy_(self.processor.next_state(state, tokens))

    def _adapted(self, capture, bs: int, *args) -> None:
        with self.adapters.capturing(bs):
            capture(bs, *args)

    def _encode(self, bs: int) -> None:
        self.enc.features[:bs] = self.backend.encode(self.enc.mel[:bs])

    def _short_buffers(self, bs: int, frames: int) -> tuple[Tensor, Tensor]:
        """The static mel and features of a short pass (bs windows of `frames` mel frames), contiguous, laid over
        the full windows' buffers (no two graphs run at once)."""
        d = self.model.dims
        mel = self.enc.mel.view(-1)[: bs * d.n_mels * frames].view(bs, d.n_mels, frames)
        features = self.enc.features.view(-1)[: bs * (frames // 2) * d.n_audio_state]
        return mel, features.view(bs, frames // 2, d.n_audio_state)

    def _encode_short(self, bs: int, frames: int) -> None:
        mel, features = self._short_buffers(bs, frames)
        features.copy_(self.backend.encode(mel))

    @torch.inference_mode()
    def capture(self) -> None:
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self.pool = pool = torch.cuda.graph_pool_handle()  # one pool shared by every graph: they never run at once
        stream = torch.cuda.Stream(self.device)
        # Capture the largest first so later, smaller graphs fit in the pool the first ones reserved.
        for bs in reversed(self.encoder_sizes):
            self.encoder_graphs[bs] = self._capture_one(lambda: self._encode(bs), pool, stream)
        for kv in reversed(self.kv_sizes):
            for bs in reversed(self.decode_sizes):
                self.decoder_graphs[(bs, kv)] = self._capture_one(lambda: self._decode_step(bs, kv), pool, stream)
        for width in reversed(self.prefill_tokens):
            for bs in reversed(self.prefill_sizes):
                self.prefill_graphs[(bs, width)] = self._capture_one(lambda: self._prefill(bs, width), pool, stream)
        for bs in reversed(self.multi_sizes):
            for ts in STAMPED:
                self.multi_graphs[(bs, ts)] = self._capture_one(lambda: self._multi_step(bs, ts), pool, stream)
        if self.adapters is not None:
            for kv in reversed(self.kv_sizes):
                for bs in reversed(self.decode_sizes):
                    self.adapted_decoder_graphs[(bs, kv)] = self._capture_one(
                        lambda: self._adapted(self._decode_step, bs, kv), pool, stream
                    )
            for bs in reversed(self.multi_sizes):
                for ts in STAMPED:
                    self.adapted_multi_graphs[(bs, ts)] = self._capture_one(
                        lambda: self._adapted(self._multi_step, bs, ts), pool, stream
                    )
        torch.cuda.synchronize(self.device)
        used = (free_before - torch.cuda.mem_get_info(self.device)[0]) / 2**20
        log.info(
            "captured %d encoder graphs (batch %s), %d decoder graphs (batch %s x context %s), %d prompt graphs "
            "(batch %s x tokens %s) and %d graphs of %d steps (batch %s, with and without timestamps)%s; pool %.0f MiB",
            len(self.encoder_graphs), self.encoder_sizes, len(self.decoder_graphs), self.decode_sizes, self.kv_sizes,
            len(self.prefill_graphs), self.prefill_sizes, self.prefill_tokens, len(self.multi_graphs),
            self.multi_steps, self.multi_sizes, ", each decoder one again with LoRA adapters" if self.adapters else "",
            used,
        )  # fmt: skip

    @torch.inference_mode()
    def capture_short_encoders(self, frames: list[int]) -> None:
        """Encoder graphs for short contexts of these mel lengths, a few windows a pass, after capture(): in the
        pool the full windows' passes reserved, which each of these fits."""
        sizes = [b for b in SHORT_ENCODER_BATCH_BUCKETS if b <= self.encoder_sizes[-1]]
        stream = torch.cuda.Stream(self.device)
        for length in sorted(frames, reverse=True):
            for bs in reversed(sizes):
                self.short_encoder_graphs[(bs, length)] = self._capture_one(
                    lambda: self._encode_short(bs, length), self.pool, stream
                )
        torch.cuda.synchronize(self.device)
        log.info("captured %d encoder graphs of short contexts (batch %s x mel frames %s)",
                 len(self.short_encoder_graphs), sizes, sorted(frames))  # fmt: skip

    def _capture_one(self, fn, pool, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()  # warm-up: lazy kernel and workspace initialisation must not happen during capture
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            fn()
        return graph

    # ---- replay -----------------------------------------------------------------------------------

    def encoder_size_for(self, n: int) -> int | None:
        """The captured batch size to pad n windows to, or None (run eagerly) when padding would waste too much."""
        for size in self.encoder_sizes:
            if size >= n:
                return size if (size - n) / size <= MAX_ENCODER_PADDING else None
        return None

    def admissible_encoder_batch(self, n: int) -> int:
        """How many of n waiting windows to admit now so the batch lands on a captured size."""
        if self.encoder_size_for(n) is not None:
            return n
        below = [s for s in self.encoder_sizes if s <= n]
        return below[-1] if below else n

    @torch.inference_mode()
    def encode(self, mels: Tensor) -> Tensor:
        n = mels.shape[0]
        if mels.shape[-1] != N_FRAMES:
            return self._encode_short_contexts(mels)
        size = self.encoder_size_for(n)
        if size is None:
            self.stats.encoder_eager += 1
            return self.backend.encode(mels)
        self.enc.mel[:n].copy_(mels)
        if size > n:
            self.enc.mel[n:size].zero_()  # padding rows: their output is ignored
            self.stats.encoder_padded_windows += size - n
        self.encoder_graphs[size].replay()
        self.stats.encoder_replays += 1
        return self.enc.features[:n]

    def _encode_short_contexts(self, mels: Tensor) -> Tensor:
        """A pass of short contexts of one length: replayed in pieces of the captured batch sizes, eagerly where
        none was captured at that length."""
        n, frames = mels.shape[0], mels.shape[-1]
        sizes = sorted(b for b, f in self.short_encoder_graphs if f == frames)
        if not sizes:
            self.stats.encoder_eager += 1
            return self.backend.encode(mels)
        pieces = []
        for start in range(0, n, sizes[-1]):
            piece = mels[start : start + sizes[-1]]
            size = next(b for b in sizes if b >= len(piece))
            mel, features = self._short_buffers(size, frames)
            mel[: len(piece)].copy_(piece)
            if size > len(piece):
                mel[len(piece) :].zero_()  # padding rows: their output is ignored
                self.stats.encoder_padded_windows += size - len(piece)
            self.short_encoder_graphs[(size, frames)].replay()
            self.stats.encoder_replays += 1
            # the next piece's replay overwrites the static features: all but the last are copied out first
            pieces.append(features[: len(piece)] if start + len(piece) >= n else features[: len(piece)].clone())
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    @torch.inference_mode()
    def decode(self, tokens: Tensor, positions: Tensor, kv_needed: int) -> Tensor | None:
        """One decoder step for rows 0..n-1 (slots 0..n-1); None if no graph fits (caller runs eagerly)."""
        n = tokens.shape[0]
        bs = next((b for b in self.decode_sizes if b >= n), None)
        kv = next((k for k in self.kv_sizes if k >= kv_needed), None)
        if bs is None or kv is None:
            self.stats.decoder_eager += 1
            return None
        self.dec.tokens[:n].copy_(tokens)
        self.dec.positions[:n].copy_(positions)
        if bs > n:
            # Padding rows decode into free slots (running sequences always occupy slots 0..n-1).
            self.dec.tokens[n:bs].zero_()
            self.dec.positions[n:bs].zero_()
        graphs = self.adapted_decoder_graphs if self.backend.adapted else self.decoder_graphs
        graphs[(bs, kv)].replay()
        self.stats.decoder_replays += 1
        return self.dec.logits[:n]

    def prefill_size_for(self, n: int, width: int) -> int | None:
        """The captured prompt-pass batch for n prompts of up to `width` tokens, or None (no graph)."""
        if width > self.prefill_tokens[-1]:
            return None
        return next((b for b in self.prefill_sizes if b >= n), None)

    def prefill_fits(self, start: int, n: int, width: int) -> bool:
        """Whether prefill() serves n new rows start.. with prompts of up to `width` tokens: a graph of that size,
        and rows that end before the graph's own (prompt_row), or are them."""
        fits_rows = start == self.prompt_row or start + n <= self.prompt_row
        return fits_rows and self.prefill_size_for(n, width) is not None

    @torch.inference_mode()
    def prefill(self, tokens: Tensor, index: Tensor, start: int, cross_slots: list[int]) -> tuple[Tensor, Tensor]:
        """A prompt pass for new rows start..start+n-1 (prefill_fits), reading the cross slots `cross_slots`:
        tokens (n, width) right-padded, index (2, n): each prompt's last token and its <|startoftranscript|>.
        The graph's rows (prompt_row..) read those cross slots, and their keys and values are copied to the new
        rows after. Returns the float32 logits at each prompt's last token and at its sot, (n, n_vocab) each."""
        n, width = tokens.shape
        bs = self.prefill_size_for(n, width)
        assert bs is not None and self.prefill_fits(start, n, width), (start, n, width)
        captured = next(w for w in self.prefill_tokens if w >= width)
        moved = start != self.prompt_row
        if moved:
            self.cache.map_rows(self.prompt_row, cross_slots)
        self.dec.prompt[:n, :width].copy_(tokens)
        self.dec.prompt_index[1:, :n].copy_(index)
        if captured > width:  # past each prompt's end: written into the cache, never attended to
            self.dec.prompt[:n, width:captured].zero_()
        if bs > n:  # padding rows write positions of free slots, as the decode graphs' padding does
            self.dec.prompt[n:bs, :captured].zero_()
            self.dec.prompt_index[1:, n:bs].zero_()
        self.prefill_graphs[(bs, captured)].replay()
        self.stats.prefill_replays += 1
        if moved:
            self.cache.move_slots([(self.prompt_row + i, start + i, width) for i in range(n)])
        return self.dec.prompt_logits[0, :n], self.dec.prompt_logits[1, :n]

    def multi_size_for(self, n: int) -> int | None:
        """The captured multi-step batch for n rows, or None (none captured that large)."""
        return next((b for b in self.multi_sizes if b >= n), None)

    @torch.inference_mode()
    def decode_multi(
        self, tokens: Tensor, positions: Tensor, no_eot: Tensor, state: Tensor | None, stamped: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """multi_steps greedy steps for rows 0..n-1 (slots 0..n-1): tokens and positions (n, 1) of the first, no_eot
        (n,) bool, the timestamp rules' state (n, 3) or None (no timestamps) and the rows it applies to (n,) bool
        (None: every row). Returns each step's tokens (steps, n) int64 and log-probabilities (steps, n) float32 and
        the state after the last step (views of static buffers: read before the next replay)."""
        n = tokens.shape[0]
        bs = self.multi_size_for(n)
        assert bs is not None, n
        self.dec.tokens[:n].copy_(tokens)
        self.dec.positions[:n].copy_(positions)
        self.dec.no_eot[:n].copy_(no_eot)
        if state is not None:
            self.dec.multi_state[:n].copy_(state)
        if stamped is not None:
            self.dec.multi_stamped[:n].copy_(stamped)
        if bs > n:  # padding rows decode positions 0.. of free slots, as a step's padding does
            self.dec.tokens[n:bs].zero_()
            self.dec.positions[n:bs].zero_()
            self.dec.no_eot[n:bs].zero_()
            self.dec.multi_state[n:bs].zero_()
            self.dec.multi_stamped[n:bs].zero_()
        graphs = self.adapted_multi_graphs if self.backend.adapted else self.multi_graphs
        graphs[(bs, "none" if state is None else "every" if stamped is None else "some")].replay()
        self.stats.multi_step_replays += 1
        out_state = None if state is None else self.dec.multi_state[:n]
        return self.dec.multi_tokens[:, :n], self.dec.multi_logprobs[:, :n], out_state
