"""CPU int8 products in isolation: the encoder's (per 30 s window, and how far int8 moves its output from
float32's, against CTranslate2's own int8 encoder on the same features), the decode kernels' one-row
vocabulary projection (float32, int8 widened to floats, and the integer dot products: their AVX2 form, and VNNI's
where the CPU has AVX-512 VNNI), and each decode product of the model for 1 and 4 rows in those int8 forms.

    python benchmarks/cpu_int8_products.py [--models tiny.en base] [--threads 2] [--repeats 7] [--no-encoder]

The encoder runs on the spontaneous clip's first 30 s window (faster-whisper's features, given to both systems);
"distance" is the relative norm ||int8 - float32|| / ||float32|| of the encoder output. Times are medians of
--repeats after a warm-up, in this process; a decode product's, of --repeats x 5 samples of as many calls as take
about 2 ms, the forms taking turns sample by sample. Prints one table each.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import statistics
import sys
import tempfile
import time
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
    qd = QuantizedWeight.of(weight_t, interleave=True)
    dot = {}
    for form in dot_forms(native):
        with form_of(native, form):
            td = median_time(lambda: native.linear_q8(x, qd, None), args.repeats * 4)
        dot[form] = f"{td * 1e3:.3f} ({mb8 / td / 1e3:.0f} GB/s)"
    return (
        f"| {name} | {tuple(weight_t.shape)} | {t32 * 1e3:.3f} ({mb32 / t32 / 1e3:.0f} GB/s) | "
        f"{t8 * 1e3:.3f} ({mb8 / t8 / 1e3:.0f} GB/s) | {dot['avx2']} | {dot.get('vnni', '-')} |"
    )


def dot_forms(native) -> list[str]:
    """The integer dot products' forms this CPU runs: AVX2's wherever the kernels load, VNNI's where it has it."""
    return ["avx2", "vnni"] if native.vnni else ["avx2"]


@contextlib.contextmanager
def form_of(native, form: str):
    before = native.dot_form
    native.dot_form = form
    try:
        yield
    finally:
        native.dot_form = before


def per_call(native, fns: dict, samples: int) -> dict[str, float]:
    """Median seconds per call of each fn (label: (dot_form, fn)), timed in samples of as many calls as take ~2 ms,
    the fns taking turns."""
    calls, times = {}, {label: [] for label in fns}
    for label, (form, fn) in fns.items():
        with form_of(native, form):
            fn()
            start, n = time.perf_counter(), 0
            while time.perf_counter() - start < 2e-3:
                fn()
                n += 1
        calls[label] = n
    for _ in range(samples):
        for label, (form, fn) in fns.items():
            with form_of(native, form):
                start = time.perf_counter()
                for _ in range(calls[label]):
                    fn()
                times[label].append((time.perf_counter() - start) / calls[label])
    return {label: statistics.median(t) for label, t in times.items()}


def product_rows(name: str, args, native) -> list[str]:
    """The decode products of one step (qkv, attention out, MLP in and out, vocabulary) for 1 and 4 rows, random
    weights of the model's shapes: int8 widened to floats, and the integer dot products in each form."""
    dims = load_checkpoint(name).dims
    d, vocab = dims.n_text_state, -(-dims.n_vocab // COLS) * COLS
    lines = []
    for rows in (1, 4):
        for k, n in ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d), (d, vocab)):
            weight_t = torch.randn(k, n) * 0.05
            plain, interleaved = QuantizedWeight.of(weight_t), QuantizedWeight.of(weight_t, interleave=True)
            x = torch.randn(rows, k)
            product = native.linear_q8 if rows == 1 else native.linear_rows
            fns = {"widened": (native.dot_form, functools.partial(product, x, plain, None))}
            for form in dot_forms(native):
                fns[form] = (form, functools.partial(product, x, interleaved, None))
            t = per_call(native, fns, args.repeats * 5)
            vnni = f"{t['vnni'] * 1e3:.4f}" if "vnni" in t else "-"
            lines.append(
                f"| {name} | {rows} | {k} x {n} | {t['widened'] * 1e3:.4f} | {t['avx2'] * 1e3:.4f} | "
                f"{t['widened'] / t['avx2']:.2f}x | {vnni} |"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-encoder", action="store_true", help="the decode kernels' products alone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.no_encoder:
        print(f"\nencoder, one 30 s window, {args.threads} threads (ms); distance from the same system's float32")
        print("| model | ours float32 | ours int8 | CTranslate2 float32 | CTranslate2 int8 | ours int8 distance | "
              "CTranslate2 int8 distance | ours float32 vs CTranslate2 float32 |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for name in args.models:
            print(encoder_row(name, args))
    native = cpu_kernels.load()
    if native is None:
        print("\nthe native CPU kernels do not build here: no decode product rows")
        return
    print("\none row's vocabulary projection in the decode kernels (ms)")
    print("| model | weight (in, out) | float32 | int8 widened to floats | int8 dot products (AVX2) | "
          "int8 dot products (VNNI) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for name in args.models:
        print(vocabulary_row(name, args, native))
    print(f"\na decode step's int8 products, {args.threads} threads (ms per product; random weights, the model's "
          "shapes)")  # fmt: skip
    print("| model | rows | in x out | widened to floats | dot products (AVX2) | widened / AVX2 | "
          "dot products (VNNI) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        print("\n".join(product_rows(name, args, native)))


if __name__ == "__main__":
    main()
