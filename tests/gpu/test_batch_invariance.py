"""Batch-invariant decoding on a GPU (KernelOptions.batch_invariant): a request's tokens do not depend on what else
runs. Kernels first (a row alone against the same row among others, bitwise), then the backend's step and prompt
pass on real weights, then whole transcripts of real clips decoded alone and among fillers: identical, no
tolerance."""

import pytest
import torch

from engine.backends.gpu_invariant import BatchInvariantGpuBackend
from engine.config import EngineConfig
from engine.kernels import invariant_few_rows, invariant_ops, row_logsumexp
from engine.kernels.fused_ops import add_norm, norm_rows
from engine.kernels.int8_attention import fixed_split_attention, quantize
from engine.kernels.options import KernelOptions
from engine.processes.engine_process import EngineProcess
from engine.request import ChunkingOptions, DecodeOptions
from engine.runtime.engine import Engine
from engine.runtime.model_runner import ModelRunner

INVARIANT = KernelOptions(batch_invariant=True)
ROW_COUNTS = (1, 2, 3, 7, 16, 63, 64, 65, 130, 200)


def _rows_alone_and_together(fn, x: torch.Tensor) -> None:
    """fn over every prefix, suffix and middle slice of x's rows gives bitwise the rows fn gives over all of x."""
    full = fn(x)
    for n in ROW_COUNTS:
        for start in {0, len(x) - n, (len(x) - n) // 2}:
            part = fn(x[start : start + n].contiguous())
            assert torch.equal(part, full[start : start + n]), (n, start)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("k", "n", "gelu"),
    [(1280, 3840, False), (1280, 1280, False), (1280, 5120, True), (5120, 1280, False), (384, 1152, False)],
)
def test_linear_rows_do_not_depend_on_the_batch(cuda, dtype, k, n, gelu, wide):
    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(200, k, device=cuda, generator=g).to(dtype)
    w = (torch.randn(n, k, device=cuda, generator=g) * k**-0.5).to(dtype)
    b = torch.randn(n, device=cuda, generator=g).to(dtype)
    _rows_alone_and_together(lambda rows: invariant_ops.linear(rows, w, b, gelu=gelu, wide=wide), x)
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
    ref = torch.nn.functional.gelu(ref, approximate="tanh") if gelu else ref
    got = invariant_ops.linear(x, w, b, gelu=gelu, wide=wide).float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, ref, atol=tol * 10, rtol=tol)  # and it is the product


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("k", "n", "gelu"), [(1280, 3840, False), (1280, 5120, True), (1280, 1280, False), (512, 1536, False)]
)
def test_a_few_rows_kernel_sums_as_the_tile_kernel(cuda, dtype, k, n, gelu, pdl):
    """Up to invariant_few_rows.MAX_ROWS rows run the kernel that copies its weight to shared memory before it
    waits (invariant_few_rows.py): bitwise the tile kernel's sums for the same rows, and the 64-row tile's for them
    among 200, launched alone or as a dependent."""
    g = torch.Generator(device=cuda).manual_seed(2)
    x = torch.randn(200, k, device=cuda, generator=g).to(dtype)
    w = (torch.randn(n, k, device=cuda, generator=g) * k**-0.5).to(dtype)
    b = torch.randn(n, device=cuda, generator=g).to(dtype)
    if invariant_few_rows.gluon is None:
        pytest.skip("this Triton has no Gluon: the tile kernel serves every row count")
    assert invariant_few_rows.applies(1, w), invariant_few_rows.broken  # the kernel under test runs here
    many = invariant_ops.linear(x, w, b, gelu=gelu)
    for rows in (1, 2, invariant_few_rows.MAX_ROWS, 16):
        few = invariant_ops.linear(x[:rows], w, b, gelu=gelu, pdl=pdl, few_rows=True)
        assert invariant_few_rows.broken is None, invariant_few_rows.broken
        assert torch.equal(few, invariant_ops.linear(x[:rows], w, b, gelu=gelu, pdl=pdl, few_rows=False)), rows
        assert torch.equal(few, many[:rows]), rows


@pytest.mark.parametrize(("k", "n"), [(384, 1152), (5120, 1280)])
def test_the_few_rows_kernel_leaves_to_the_tile_kernel_what_it_does_not_take(cuda, k, n):
    """An odd number of chunks (tiny's width: its sums differed), a slab of 8 features (fc2's width: slower) and
    more than MAX_ROWS rows run the tile kernel, few_rows or not."""
    if invariant_few_rows.gluon is None:
        pytest.skip("this Triton has no Gluon")
    w = torch.randn(n, k, device=cuda).to(torch.float16)
    assert not invariant_few_rows.applies(1, w)
    assert not invariant_few_rows.applies(invariant_few_rows.MAX_ROWS + 1, torch.empty(3840, 1280, device=cuda).half())
    x = torch.randn(3, k, device=cuda).to(torch.float16)
    assert torch.equal(invariant_ops.linear(x, w, few_rows=True), invariant_ops.linear(x, w))


@pytest.mark.parametrize("add", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("k", "n", "gelu"), [(1280, 3840, False), (1280, 5120, True), (512, 1536, False)])
def test_a_few_rows_residual_add_and_norm_inside_the_product(cuda, dtype, k, n, gelu, add):
    """add_norm_linear (the add and the norm in the product's kernel, a lone window's step) against add_norm (or
    norm_rows) and then the product for the same rows among 200: bitwise, the residual stream too."""
    if invariant_few_rows.gluon is None:
        pytest.skip("this Triton has no Gluon")
    g = torch.Generator(device=cuda).manual_seed(3)
    ln = torch.nn.LayerNorm(k, device=cuda, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(k, device=cuda, generator=g) * 0.5 + 1)
        ln.bias.copy_(torch.randn(k, device=cuda, generator=g) * 0.1)
    x = (torch.randn(200, 1, k, device=cuda, generator=g) * 3).to(dtype)
    y = torch.randn(200, 1, k, device=cuda, generator=g).to(dtype) if add else None
    w = (torch.randn(n, k, device=cuda, generator=g) * k**-0.5).to(dtype)
    b = torch.randn(n, device=cuda, generator=g).to(dtype)
    warps = invariant_ops.NORM_WARPS
    x_all, h_all = add_norm(x, y, ln, warps=warps) if add else (x, norm_rows(ln, x, warps=warps))
    out_all = invariant_ops.linear(h_all, w, b, gelu=gelu)
    for rows in (1, 3, invariant_few_rows.MAX_ROWS):
        fused = invariant_ops.add_norm_linear(
            x[:rows].contiguous(), y[:rows].contiguous() if add else None, ln, w, b, gelu=gelu, pdl=True
        )
        assert fused is not None, invariant_few_rows.broken
        assert torch.equal(fused[0], x_all[:rows]), rows
        assert torch.equal(fused[1], out_all[:rows]), rows


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_wide_products_of_many_windows_do_not_depend_on_the_batch(cuda, dtype):
    """The encoder's products over several windows (1,500 rows each): more output tiles than programs, so each
    program takes several tiles, and a window's rows land in other tiles and programs with every window count."""
    g = torch.Generator(device=cuda).manual_seed(1)
    k, n, window = 1280, 1280, 1500
    x = torch.randn(5 * window, k, device=cuda, generator=g).to(dtype)
    w = (torch.randn(n, k, device=cuda, generator=g) * k**-0.5).to(dtype)
    b = torch.randn(n, device=cuda, generator=g).to(dtype)
    full = invariant_ops.linear(x, w, b, wide=True)
    for start, count in [(0, 1), (0, 2), (1, 3), (2, 3), (4, 1), (0, 4)]:
        rows = slice(start * window, (start + count) * window)
        assert torch.equal(invariant_ops.linear(x[rows].contiguous(), w, b, wide=True), full[rows]), (start, count)
    odd = slice(37, 37 + 2 * window)  # rows that start inside a tile
    assert torch.equal(invariant_ops.linear(x[odd].contiguous(), w, b, wide=True), full[odd])


def test_vocabulary_projection_rows_into_a_float32_buffer(cuda):
    g = torch.Generator(device=cuda).manual_seed(1)
    v, k = 51904, 1280  # large-v3's vocabulary padded to 64
    x = torch.randn(200, k, device=cuda, generator=g).half()
    w = (torch.randn(v, k, device=cuda, generator=g) * k**-0.5).half()

    def logits(rows):
        out = torch.full((len(rows), 51866), float("nan"), device=cuda)
        return invariant_ops.linear(rows, w, out=out, n_valid=51866)

    _rows_alone_and_together(logits, x)
    # rounded to float16 first, as a half-precision product's output is
    expected = torch.nn.functional.linear(x.float(), w.float())[:, :51866].half().float()
    torch.testing.assert_close(logits(x), expected, atol=2e-2, rtol=2e-2)


def test_norm_and_logsumexp_rows_do_not_depend_on_the_batch(cuda):
    g = torch.Generator(device=cuda).manual_seed(2)
    ln = torch.nn.LayerNorm(1280, device=cuda, dtype=torch.float16)
    x = torch.randn(200, 1, 1280, device=cuda, generator=g).half()
    _rows_alone_and_together(lambda rows: norm_rows(ln, rows), x)
    torch.testing.assert_close(norm_rows(ln, x), ln(x), atol=2e-3, rtol=2e-3)
    logits = torch.randn(200, 1501, device=cuda, generator=g) * 5
    logits[3, :] = float("-inf")
    logits[5, ::2] = float("-inf")
    _rows_alone_and_together(row_logsumexp.logsumexp_rows, logits)
    torch.testing.assert_close(row_logsumexp.logsumexp_rows(logits), logits.logsumexp(-1))


@pytest.mark.parametrize(
    ("channels", "width", "stride"), [(80, 384, 1), (128, 1280, 1), (384, 384, 2), (1280, 1280, 2)]
)
def test_the_encoder_convolutions_and_attention_per_window_do_not_depend_on_the_batch(cuda, channels, width, stride):
    g = torch.Generator(device=cuda).manual_seed(5)
    conv = torch.nn.Conv1d(channels, width, 3, stride=stride, padding=1, device=cuda, dtype=torch.float16)
    x = torch.randn(9, channels, 600, device=cuda, generator=g).half()
    together = invariant_ops.conv1d(conv, x)
    for lo, hi in ((0, 1), (4, 5), (8, 9), (2, 7)):
        assert torch.equal(invariant_ops.conv1d(conv, x[lo:hi].contiguous()), together[lo:hi]), (lo, hi)
    torch.testing.assert_close(together, conv(x), atol=3e-2, rtol=3e-2)
    heads = width // 64
    q, k, v = (torch.randn(9, heads, 1500, 64, device=cuda, generator=g).half() for _ in range(3))
    together = invariant_ops.attention(q, k, v)
    for lo, hi in ((0, 1), (8, 9), (2, 7)):
        alone = invariant_ops.attention(q[lo:hi], k[lo:hi], v[lo:hi])
        assert torch.equal(alone, together[lo:hi]), (lo, hi)
    torch.testing.assert_close(
        together, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=2e-3, rtol=2e-3
    )


@pytest.mark.parametrize("int8", [True, False])
def test_cross_attention_rows_do_not_depend_on_the_batch(cuda, int8):
    g = torch.Generator(device=cuda).manual_seed(3)
    b, h, n, d = 130, 20, 1500, 64
    q = torch.randn(b, h, 1, d, device=cuda, generator=g).half()
    k = torch.randn(b, h, n, d, device=cuda, generator=g).half()
    v = torch.randn(b, h, n, d, device=cuda, generator=g).half()
    if int8:
        (k, ks), (v, vs) = quantize(k), quantize(v)
    else:
        ks = vs = None

    def attend(lo: int, hi: int) -> torch.Tensor:
        sl = slice(lo, hi)
        scales = (ks[sl], vs[sl]) if int8 else (None, None)
        return fixed_split_attention(q[sl], k[sl], v[sl], scales[0], scales[1], INVARIANT)

    full = attend(0, b)
    for n_rows in (1, 2, 7, 64):
        for start in (0, b - n_rows):
            assert torch.equal(attend(start, start + n_rows), full[start : start + n_rows]), (n_rows, start)


@pytest.fixture(scope="module", params=[False, True], ids=["tile", "few-rows"])
def invariant_runner(cuda, gpu_model, request):
    """The invariant runner with the tile kernel at every row count, and with the few-rows kernel up to its
    MAX_ROWS rows: a lone row then takes other kernels than a batch's, with the same sums."""
    kernels = KernelOptions(batch_invariant=True, invariant_few_rows=request.param)
    runner = ModelRunner(EngineConfig(model=gpu_model, device="cuda", max_num_seqs=64, kernels=kernels))
    assert isinstance(runner.backend, BatchInvariantGpuBackend)
    return runner


def test_a_step_row_alone_equals_the_row_among_others(invariant_runner):
    """A probe row's logits alone (a graph of batch 1) and among random rows, in every slot it may land in."""
    r = invariant_runner
    torch.manual_seed(4)
    cache, pos = r.cache, 37
    cache.self_kv.normal_()
    if cache.int8_cross:
        cache.cross_k.random_(-100, 100), cache.cross_v.random_(-100, 100)
        cache.cross_k_scale.uniform_(1e-3, 1e-2), cache.cross_v_scale.uniform_(1e-3, 1e-2)
    else:
        cache.cross_k.normal_(), cache.cross_v.normal_()
    probe = [cache.self_kv[:, :, 63].clone(), cache.cross_k[:, 63].clone(), cache.cross_v[:, 63].clone()]
    scales = [t[:, 63].clone() for t in (cache.cross_k_scale, cache.cross_v_scale)] if cache.int8_cross else []

    def probe_logits(slot: int, others: int) -> torch.Tensor:
        cache.self_kv[:, :, slot] = probe[0]
        cache.cross_k[:, slot], cache.cross_v[:, slot] = probe[1], probe[2]
        if scales:
            cache.cross_k_scale[:, slot], cache.cross_v_scale[:, slot] = scales
        rows = max(slot + 1, others + 1)
        tokens = torch.randint(0, r.dims.n_vocab, (rows, 1), device="cuda")
        positions = torch.randint(0, 200, (rows, 1), device="cuda")
        tokens[slot, 0], positions[slot, 0] = 220, pos
        return r.graphs.decode(tokens, positions, 448)[slot].clone()

    alone = probe_logits(0, 0)
    assert torch.isfinite(alone).all()
    for slot, others in [(0, 1), (0, 7), (5, 7), (30, 40), (0, 62), (62, 62)]:
        assert torch.equal(probe_logits(slot, others), alone), (slot, others)


def test_a_window_encoded_alone_equals_the_window_encoded_among_others(invariant_runner, gpu_clips, read_wav):
    """Features and cross K/V of real windows, each encoded alone (a graph of batch 1) and in batches of 2 to 16
    (graphs with padding rows, and eager), bitwise."""
    r = invariant_runner
    audios = [read_wav(p) for p in gpu_clips]
    mels = [r.mel(torch.from_numpy(audios[i % len(audios)]))[:, :3000] for i in range(16)]
    mels = [torch.nn.functional.pad(m, (0, 3000 - m.shape[1])) for m in mels]

    def cross_of(windows: list[int], start_slot: int) -> list[torch.Tensor]:
        slots = list(range(start_slot, start_slot + len(windows)))
        r.encode_into_slots([mels[i] for i in windows], slots)
        held = [
            t for t in (r.cache.cross_k, r.cache.cross_v, r.cache.cross_k_scale, r.cache.cross_v_scale) if t is not None
        ]
        return [torch.cat([t[:, s].flatten().float() for t in held]) for s in slots]

    alone = [cross_of([i], 0)[0] for i in range(16)]
    for windows in ([0, 1], [3, 2, 1], list(range(7)), list(range(16)), [15, *range(12)]):
        got = cross_of(windows, 20)
        assert all(torch.equal(got[j], alone[i]) for j, i in enumerate(windows)), windows
    batch = torch.stack(mels[:5]).to(device="cuda", dtype=r.dtype)
    eager = r.backend.encode(batch)
    for i in range(5):
        assert torch.equal(r.backend.encode(batch[i : i + 1])[0], eager[i]), i


def test_a_prompt_pass_equals_feeding_the_prompt_step_by_step(invariant_runner):
    r = invariant_runner
    tok = r.tokenizer
    prompt = [
        tok.sot_prev,
        *tok.encode(" Earlier text of the recording, as context."),
        *tok.sot_sequence("en", "transcribe"),
    ]
    tokens = torch.tensor([prompt, prompt], device="cuda")
    cache = r.cache
    cache.self_kv.zero_()
    for slot in (3, 10):  # the same audio in slots 2, 3 and 10
        for t in [t for t in (cache.cross_k, cache.cross_v, cache.cross_k_scale, cache.cross_v_scale) if t is not None]:
            t[:, slot] = t[:, 2]
    one_pass = r.backend.prompt_pass(tokens, r.cache, 2)  # slots 2 and 3
    kv_pass = r.cache.self_kv[:, :, 2].clone()
    steps = []
    for p, t in enumerate(prompt):  # slot 10, alone, one token per step
        x = r.backend.decode_step(
            torch.tensor([[t]], device="cuda"), torch.tensor([[p]], device="cuda"), r.cache, 448, 10
        )
        steps.append(x[0, 0])
    assert torch.equal(one_pass[0], torch.stack(steps))
    assert torch.equal(one_pass[1], one_pass[0])
    assert torch.equal(r.cache.self_kv[:, :, 10, :, : len(prompt)], kv_pass[:, :, :, : len(prompt)])


def _tokens(result) -> list[int]:
    return [t for s in result.segments for t in s.tokens]


def _alone_and_among_fillers(engine, audios, options, filler_counts=(1, 7, 64, 200)) -> None:
    alone = [_tokens(engine.submit(a, options).wait(timeout=300)) for a in audios]
    for n in filler_counts:
        others = [audios[j % len(audios)] for j in range(n)]
        fillers = [engine.submit(a, options) for a in others[: n // 2]]
        probes = [engine.submit(a, options) for a in audios]
        fillers += [engine.submit(a, options) for a in others[n // 2 :]]
        got = [_tokens(h.wait(timeout=600)) for h in probes]
        for h in fillers:
            h.wait(timeout=600)
        differ = [i for i, (a, b) in enumerate(zip(alone, got)) if a != b]
        assert not differ, f"{len(differ)} of {len(audios)} clips differ among {n} fillers ({options})"


@pytest.mark.parametrize(
    ("dtype", "cross"), [("float16", "int8"), ("float16", "model"), ("bfloat16", "int8"), ("bfloat16", "model")]
)
def test_transcripts_alone_equal_transcripts_among_fillers(cuda, gpu_model, gpu_clips, read_wav, dtype, cross):
    config = EngineConfig(
        model=gpu_model, device="cuda", dtype=dtype, cross_cache_dtype=cross, max_num_seqs=256, max_waiting=4096,
        kernels=INVARIANT,
    )  # fmt: skip
    engine = Engine(config)
    engine.start()
    try:
        audios = [read_wav(p) for p in gpu_clips]
        for timestamps in (True, False):
            options = DecodeOptions(temperatures=(0.0,), without_timestamps=not timestamps)
            _alone_and_among_fillers(engine, audios, options)
        stats = engine.stats().extra
        assert stats["decoder_graph_replays"] > 0 and stats["multi_step_graph_replays"] > 0
    finally:
        engine.shutdown()


def test_word_timestamps_sampling_and_chunked_mode_do_not_depend_on_the_batch(cuda, gpu_model, gpu_clips, read_wav):
    engine = Engine(EngineConfig(model=gpu_model, device="cuda", max_num_seqs=256, max_waiting=4096, kernels=INVARIANT))
    engine.start()
    try:
        audios = [read_wav(p) for p in gpu_clips]
        long_audio = torch.cat([torch.from_numpy(a) for a in audios]).numpy()  # several windows
        cases = [
            DecodeOptions(temperatures=(0.0,), word_timestamps=True),
            DecodeOptions(temperatures=(0.8,), seed=7),  # every token drawn, from the request's own generator
            DecodeOptions(temperatures=(0.0, 0.4, 0.8), compression_ratio_threshold=1.0, seed=3),  # fallbacks
            DecodeOptions(temperatures=(0.0,), beam_size=5, without_timestamps=True),  # beams: rows of the batch
            DecodeOptions(temperatures=(0.0,), beam_size=5, word_timestamps=True),
        ]
        for options in cases:
            _alone_and_among_fillers(engine, audios, options, filler_counts=(7, 64))
        for options in (
            DecodeOptions(temperatures=(0.0,), chunking=ChunkingOptions()),
            DecodeOptions(temperatures=(0.8,), chunking=ChunkingOptions(), seed=5),
        ):
            alone = _tokens(engine.submit(long_audio, options).wait(timeout=300))
            fillers = [engine.submit(a, options) for a in audios * 4]
            again = _tokens(engine.submit(long_audio, options).wait(timeout=300))
            for h in fillers:
                h.wait(timeout=300)
            assert again == alone, options
    finally:
        engine.shutdown()


def test_the_engine_process_gives_the_in_process_tokens(cuda, gpu_model, gpu_clips, read_wav):
    """The child process forms its batches from pipe messages, another order than the in-process engine's."""
    config = EngineConfig(model=gpu_model, device="cuda", max_num_seqs=16, kernels=INVARIANT)
    audios = [read_wav(p) for p in gpu_clips]
    options = DecodeOptions(temperatures=(0.0,))

    def run(engine):
        engine.start()
        try:
            return [_tokens(h.wait(timeout=300)) for h in [engine.submit(a, options) for a in audios]]
        finally:
            engine.shutdown()

    assert run(EngineProcess(config)) == run(Engine(config))
