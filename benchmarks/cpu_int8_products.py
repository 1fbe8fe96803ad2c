"""CPU int8 products in isolation: the encoder's (per 30 s window, and how far int8 moves its output from
float32's, against CTranslate2's own int8 encoder on the same features) and the decode kernels' one-row
vocabulary projection (float32, int8 widened to floats, and int8 dot products where the CPU has AVX-512 VNNI).

    python benchmarks/cpu_int8_products.py [--models tiny.en base] [--threads 2] [--repeats 7]

The encoder runs on the spontaneous clip's first 30 s window (faster-whisper's features, given to both systems);
"distance" is the relative norm ||int8 - float32|| / ||float32|| of the encoder output. Times are medians of
--repeats after a warm-up, in this process. Prints one table.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_peers import CLIPS, DATA, ct2_model_dir, median_time

from engine.audio.uploads import decode_audio
from engine.backends.cpu_int8_encoder import Int8Blocks
from engine.kernels import cpu_kernels
from engine.kernels.cpu_kernels import COLS, QuantizedWeight
from engine.model.weights import load_checkpoint, resolve_model
from engine.model.whisper import Whisper


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def first_window(n_mels: int) -> np.ndarray:
    from faster_whisper.feature_extractor import FeatureExtractor

    audio = decode_audio(DATA / CLIPS["spontaneous 26.7 s"])
    mel = FeatureExtractor(feature_size=n_mels)(audio)[:, :3000]
    return np.pad(mel, ((0, 0), (0, 3000 - mel.shape[1]))).astype(np.float32)[None]


def encoder_row(name: str, args) -> str:
    import ctranslate2

    checkpoint = load_checkpoint(name)
    with torch.device("meta"):
        model = Whisper(checkpoint.dims)
    model.load_state_dict(checkpoint.state_dict, strict=True, assign=True)
    encoder = model.float().eval().requires_grad_(False).encoder
    int8 = copy.deepcopy(encoder)
    int8.use_quantized(Int8Blocks(int8.blocks))
    mel = first_window(checkpoint.dims.n_mels)
    with torch.inference_mode():
        x = torch.from_numpy(mel)
        ours32, ours8 = encoder(x), int8(x)
        t32 = median_time(lambda: encoder(x), args.repeats)
        t8 = median_time(lambda: int8(x), args.repeats)
    ct2 = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(ct2_model_dir(resolve_model(name), Path(tmp)))
        for compute in ("float32", "int8"):
            peer = ctranslate2.models.Whisper(model_dir, device="cpu", compute_type=compute, intra_threads=args.threads)
            features = ctranslate2.StorageView.from_array(mel)
            ct2[compute] = torch.tensor(np.array(peer.encode(features)))
            ct2[compute + " s"] = median_time(lambda p=peer, f=features: p.encode(f), args.repeats)
    return (
        f"| {name} | {t32 * 1e3:.0f} | {t8 * 1e3:.0f} | {ct2['float32 s'] * 1e3:.0f} | {ct2['int8 s'] * 1e3:.0f} | "
        f"{distance(ours8, ours32):.4f} | {distance(ct2['int8'], ct2['float32']):.4f} | "
        f"{distance(ours32, ct2['float32']):.6f} |"
    )


def vocabulary_row(name: str, args, native) -> str:
    embedding = load_checkpoint(name).state_dict["decoder.token_embedding.weight"].float()
    columns = -(-embedding.shape[0] // COLS) * COLS
    weight_t = torch.cat([embedding, embedding.new_zeros(columns - embedding.shape[0], embedding.shape[1])]).t()
    weight_t = weight_t.contiguous()
    q = QuantizedWeight.of(weight_t)
    x = torch.randn(1, weight_t.shape[0])
    t32 = median_time(lambda: native.linear(x, weight_t, None), args.repeats * 4)
    t8 = median_time(lambda: native.linear_q8(x, q, None), args.repeats * 4)
    mb8, mb32 = weight_t.numel() / 1e6, weight_t.numel() * 4 / 1e6
    dot = "-"
    if native.vnni:
        qd = QuantizedWeight.of(weight_t, interleave=True)
        td = median_time(lambda: native.linear_q8(x, qd, None), args.repeats * 4)
        dot = f"{td * 1e3:.3f} ({mb8 / td / 1e3:.0f} GB/s)"
    return (
        f"| {name} | {tuple(weight_t.shape)} | {t32 * 1e3:.3f} ({mb32 / t32 / 1e3:.0f} GB/s) | "
        f"{t8 * 1e3:.3f} ({mb8 / t8 / 1e3:.0f} GB/s) | {dot} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"\nencoder, one 30 s window, {args.threads} threads (ms); distance from the same system's float32")
    print("| model | ours float32 | ours int8 | CTranslate2 float32 | CTranslate2 int8 | ours int8 distance | "
          "CTranslate2 int8 distance | ours float32 vs CTranslate2 float32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        print(encoder_row(name, args))
    native = cpu_kernels.load()
    if native is None:
        print("\nthe native CPU kernels do not build here: no vocabulary projection row")
        return
    print("\none row's vocabulary projection in the decode kernels (ms)")
    print("| model | weight (in, out) | float32 | int8 widened to floats | int8 dot products (VNNI) |")
    print("|---|---|---|---|---|")
    for name in args.models:
        print(vocabulary_row(name, args, native))


if __name__ == "__main__":
    main()
