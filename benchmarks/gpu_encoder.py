"""The encoder alone on a GPU: float16 with separate and fused q/k/v products, then float8 ones (engine/kernels/fp8.py).

    python benchmarks/gpu_encoder.py [--model large-v3] [--batch 1 8 32] [--repeats 5] [--model-dtype-blocks N]

Prints milliseconds per encoder pass and per window for each batch size, float16 with q/k/v as three products and
as one (AudioEncoder.fuse_qkv, the engine's choice on a GPU), then float8, in one process (the same weights,
quantized after the float16 runs), and the float8 output's relative error against float16 on the
same random input. Eager passes timed with CUDA events after two warm-ups; the engine replays them as graphs,
which for batches this large changes little. Quality on real speech is tests/gpu/test_fp8_encoder.py's job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.kernels.fp8 import MODEL_DTYPE_BLOCKS, Fp8Blocks, unsupported_reason  # noqa: E402
from engine.model.dims import DUMMY_DIMS  # noqa: E402
from engine.model.weights import dummy_state_dict  # noqa: E402
from engine.model.whisper import AudioEncoder  # noqa: E402


def time_ms(encoder: AudioEncoder, mel: torch.Tensor, repeats: int) -> float:
    with torch.inference_mode():
        for _ in range(2):
            encoder(mel)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            encoder(mel)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="large-v3", choices=sorted(DUMMY_DIMS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model-dtype-blocks", type=int, default=MODEL_DTYPE_BLOCKS,
                    help="first blocks kept in float16 (the engine's choice by default)")
    args = ap.parse_args()
    device = torch.device("cuda")
    if why := unsupported_reason(device, torch.float16):
        sys.exit(why)
    dims = DUMMY_DIMS[args.model]
    state = dummy_state_dict(dims, dtype=torch.float16, device=device)
    prefix = "encoder."
    with torch.device("meta"):
        encoder = AudioEncoder(dims)
    encoder.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}, assign=True)
    encoder = encoder.to(device).eval()
    gen = torch.Generator(device).manual_seed(0)
    mels = {b: torch.randn(b, dims.n_mels, 3000, device=device, generator=gen, dtype=torch.float16) for b in args.batch}
    separate = {b: time_ms(encoder, mel, args.repeats) for b, mel in mels.items()}
    with torch.inference_mode():
        reference = encoder(mels[args.batch[0]]).float()
        encoder.fuse_qkv()
        fused_error = (encoder(mels[args.batch[0]]).float() - reference).norm() / reference.norm()
    half = {b: time_ms(encoder, mel, args.repeats) for b, mel in mels.items()}
    with torch.inference_mode():
        encoder.use_quantized(Fp8Blocks(encoder.blocks, args.model_dtype_blocks))
        torch.cuda.empty_cache()
        error = (encoder(mels[args.batch[0]]).float() - reference).norm() / reference.norm()
    eight = {b: time_ms(encoder, mel, args.repeats) for b, mel in mels.items()}
    print(f"{torch.cuda.get_device_name()}, {args.model} encoder, dummy weights, first {encoder.quantized_start} blocks "
          f"in float16; relative error against separate q/k/v: fused {fused_error.item():.1e}, float8 "
          f"{error.item():.4f}")  # fmt: skip
    print("| batch | float16 separate q/k/v ms | float16 fused ms | float8 ms | float16 fused ms per window "
          "| float8 ms per window | float8 / float16 fused |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for b in args.batch:
        print(f"| {b} | {separate[b]:.1f} | {half[b]:.1f} | {eight[b]:.1f} | {half[b] / b:.2f} | {eight[b] / b:.2f} "
              f"| {eight[b] / half[b]:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
