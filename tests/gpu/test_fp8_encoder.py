"""Float8 encoder products (encoder_precision="float8"): the quantizing kernels against torch, the encoder against
its float16 self on real speech, graph replay against eager, and transcripts of real clips against references."""

import jiwer
import pytest
import torch
import torch.nn.functional as F

from engine.audio.constants import N_FRAMES
from engine.audio.features import pad_or_trim
from engine.config import EngineConfig
from engine.kernels import fp8
from engine.kernels.fused_ops import add_norm_fp8, quantize_rows
from engine.request import DecodeOptions
from engine.runtime.engine import Engine
from tests.helpers.transcripts import normalize_english


@pytest.fixture(scope="module")
def fp8_device(cuda):
    why = fp8.unsupported_reason(cuda, torch.float16)
    if why:
        pytest.skip(why)
    return cuda


def assert_quantized(q: torch.Tensor, scale: torch.Tensor, ref: torch.Tensor) -> None:
    """q * scale holds ref to e4m3's precision: a scale per row of amax / 448, and each value within half a step
    (3 mantissa bits: 1/16 of the value) or, for the smallest values, half a subnormal step."""
    ref = ref.float()
    amax = ref.abs().amax(dim=-1, keepdim=True)
    assert torch.allclose(scale, amax / 448, rtol=1e-6)
    back = q.float() * scale
    assert ((back - ref).abs() <= ref.abs() / 16 + scale * 2**-9 * 1.01).all()
    assert (back.abs().amax(dim=-1) <= amax.squeeze(-1) * 1.0001).all()


def test_add_norm_fp8_quantizes_the_normalized_rows(fp8_device):
    gen = torch.Generator(fp8_device).manual_seed(0)
    x, y = (torch.randn(300, 1280, device=fp8_device, generator=gen, dtype=torch.float16) for _ in "xy")
    ln = torch.nn.LayerNorm(1280, device=fp8_device, dtype=torch.float16)
    with torch.no_grad():
        ln.weight.normal_(1, 0.3, generator=gen), ln.bias.normal_(0, 0.3, generator=gen)
    s, hq, h_scale = add_norm_fp8(x, y, ln)
    assert hq.dtype == torch.float8_e4m3fn and h_scale.shape == (300, 1)
    assert torch.equal(s, x + y)
    assert_quantized(hq, h_scale, F.layer_norm((x + y).float(), (1280,), ln.weight.float(), ln.bias.float()))


def test_quantize_rows_reads_an_attention_output_in_place(fp8_device):
    gen = torch.Generator(fp8_device).manual_seed(1)
    o = torch.randn(3, 20, 1500, 64, device=fp8_device, generator=gen, dtype=torch.float16)  # (batch, heads, time, dim)
    view = o.transpose(1, 2)  # (batch, time, heads, dim), not contiguous
    q, scale = quantize_rows(view)
    assert q.shape == (4500, 1280) and scale.shape == (4500, 1)
    assert_quantized(q, scale, view.reshape(4500, 1280))


def test_quantize_rows_applies_the_gelu(fp8_device):
    gen = torch.Generator(fp8_device).manual_seed(2)
    f = torch.randn(1000, 5120, device=fp8_device, generator=gen, dtype=torch.float16) * 3
    q, scale = quantize_rows(f, gelu=True)
    assert_quantized(q, scale, F.gelu(f.float(), approximate="tanh"))


@pytest.fixture(scope="module")
def engines(fp8_device, gpu_model):
    made = [
        Engine(EngineConfig(model=gpu_model, device="cuda", max_num_seqs=32, encoder_precision=p))
        for p in ("model", "float8")
    ]
    for e in made:
        e.start()
    yield made
    for e in made:
        e.shutdown()


def test_fp8_encoder_stays_close_to_float16_on_speech(engines, gpu_clips, read_wav):
    """Real weights and real speech: the encoder's output in float8 within a few percent of the float16 one,
    and the graphs replay what the float8 encoder computes eagerly."""
    half, eight = (e.runner for e in engines)
    assert half.model.encoder.quantized is None and eight.model.encoder.quantized is not None
    audio = torch.from_numpy(read_wav(gpu_clips[0]))
    mel = pad_or_trim(half.mel(audio), N_FRAMES)
    mels = torch.stack([mel] * 2).to(torch.float16)  # two windows: a captured batch size
    with torch.inference_mode():
        ref = half.model.encoder(mels).float()
        ours = eight.model.encoder(mels).float()
        replayed = eight.graphs.encode(mels).float()
    err = ((ours - ref).norm() / ref.norm()).item()
    cos = F.cosine_similarity(ours.flatten(0, 1), ref.flatten(0, 1), dim=-1)
    print(f"\nfloat8 encoder: relative error {err:.4f}, frame cosine p1 {cos.quantile(0.01).item():.4f}, "
          f"worst {cos.min().item():.4f}")  # fmt: skip
    # with every block in float8: 8.9% and 0.989 here, a few frames far off (worst -0.14); the first blocks in
    # float16 (engine/kernels/fp8.py) bring the CPU emulation of these products to ~4% and 0.998 (tests/integration)
    assert err < 0.07 and cos.quantile(0.01).item() > 0.995
    assert eight.graphs.stats.encoder_replays > 0
    assert torch.allclose(replayed, ours, rtol=1e-3, atol=1e-3)


def test_fp8_encoder_transcribes_as_well_as_float16(engines, gpu_clips, read_wav):
    """Word error rate on the clips with references: float8 within one point of float16."""
    clips = [p for p in gpu_clips if p.with_suffix(".txt").exists()]
    if len(clips) < 5:
        pytest.skip("needs clips with reference transcripts (.txt beside the .wav)")
    references = [normalize_english(p.with_suffix(".txt").read_text()) for p in clips]
    audios = [read_wav(p) for p in clips]
    options = DecodeOptions(temperatures=(0.0,))

    def run(engine):
        handles = [engine.submit(a, options) for a in audios]
        return [normalize_english(h.wait(timeout=300).text) for h in handles]

    half, eight = run(engines[0]), run(engines[1])
    wer_half, wer_eight = jiwer.wer(references, half), jiwer.wer(references, eight)
    same = sum(a == b for a, b in zip(half, eight))
    print(f"\n{len(clips)} clips: WER float16 {wer_half:.4f}, float8 {wer_eight:.4f}; {same} transcripts identical")
    assert wer_eight <= wer_half + 0.01
