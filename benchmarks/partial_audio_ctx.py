"""What a truncated encoder context would cost and save for realtime partial decodes (issue: partials re-encode a
padded 30 s window). Measurement only: the server does not use it.

    python benchmarks/partial_audio_ctx.py --model tiny.en [--margin-s 1.0] [--cuts 1 2 3 5 8]

A growing turn's partial decode hears its first L seconds. Today it is encoded as a full window: L seconds of audio
and 30 - L of padding, 1,500 encoder positions. Whisper's encoder also runs on the first N positions alone (the
mel's first 2N frames; whisper.cpp's `audio_ctx`): here N covers L plus `--margin-s` of the padding. For each real
clip in tests/data and each cut L, both are decoded greedily (the same plain loop, float32, this CPU) and compared:
the encoder's and the decoder's time, and how many of the full window's words the truncated decode gives in the
same order (difflib's matching blocks over the normalized words), and whether the text is the same. Prints one
row per cut and the totals.
"""

from __future__ import annotations

import argparse
import difflib
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.audio.constants import N_FRAMES, SAMPLE_RATE, TOKENS_PER_SECOND
from engine.audio.features import pad_or_trim
from engine.audio.uploads import decode_audio
from engine.config import EngineConfig
from engine.model.kv_cache import CacheShape, KVCache
from engine.runtime.model_runner import ModelRunner
from tests.helpers.transcripts import normalize_text

CLIPS = sorted(p for p in (ROOT / "tests" / "data").glob("g1_en_librispeech-*") if p.suffix in (".wav", ".flac"))
MAX_TOKENS = 96


def greedy(runner: ModelRunner, mel: torch.Tensor) -> tuple[str, float, float]:
    """mel (n_mels, 2N) -> (text, encoder s, decoder s): the encoder over N positions, a plain greedy loop whose
    cross-attention reads those N (text tokens and <|endoftext|> only, no timestamps)."""
    model, tok = runner.model, runner.tokenizer
    dec = model.decoder
    start = time.perf_counter()
    features = model.encoder(mel[None])
    encoded = time.perf_counter()
    d = runner.dims
    shape = CacheShape(d.n_text_layer, d.n_text_head, d.n_text_state // d.n_text_head, d.n_text_ctx, features.shape[1])
    cache = KVCache(shape, 1, features.dtype, features.device)
    dec.fill_cross_cache(features, cache, 0)
    prompt = [*tok.sot_sequence("en" if tok.is_multilingual else None, "transcribe"), tok.no_timestamps]
    tokens = torch.tensor([prompt])
    positions = torch.arange(len(prompt))[None]
    mask = torch.ones(len(prompt), len(prompt), dtype=torch.bool).tril()[None, None]
    hidden = dec(tokens, positions, cache, 0, len(prompt), mask)[:, -1]
    out: list[int] = []
    for _ in range(MAX_TOKENS):
        logits = hidden @ dec.token_embedding.weight.T
        logits[..., tok.eot + 1 :] = -math.inf  # no special token but the end
        token = int(logits.argmax())
        if token == tok.eot:
            break
        out.append(token)
        p = len(prompt) + len(out) - 1
        hidden = dec(torch.tensor([[token]]), torch.tensor([[p]]), cache, 0, p + 1, None, position=p)[:, -1]
    return tok.decode(out).strip(), encoded - start, time.perf_counter() - encoded


def matched(reference: list[str], words: list[str]) -> int:
    return sum(b.size for b in difflib.SequenceMatcher(a=reference, b=words, autojunk=False).get_matching_blocks())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--cuts", nargs="+", type=float, default=[1, 2, 3, 5, 8])
    ap.add_argument("--margin-s", type=float, default=1.0, help="padding kept after the cut, in seconds")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    runner = ModelRunner(EngineConfig(model=args.model, device="cpu", dtype="float32", enforce_eager=True))
    clips = [decode_audio(p.read_bytes()) for p in CLIPS]
    print(f"{args.model}, {len(clips)} LibriSpeech clips, margin {args.margin_s:g} s, float32, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("| cut s | positions | encoder ms full / truncated | decoder ms full / truncated | words matched | "
          "same text |\n|---|---|---|---|---|---|")  # fmt: skip
    totals = np.zeros(4)
    for cut in args.cuts:
        n = min(1500, math.ceil((cut + args.margin_s) * TOKENS_PER_SECOND))
        enc, dec_s, words, hits, same = [[], []], [[], []], 0, 0, 0
        for audio in clips:
            piece = audio[: int(cut * SAMPLE_RATE)]
            mel = runner.log_mel(torch.from_numpy(piece))
            full = greedy(runner, pad_or_trim(mel, N_FRAMES))
            short = greedy(runner, pad_or_trim(mel, 2 * n))
            for i, r in enumerate((full, short)):
                enc[i].append(r[1] * 1000)
                dec_s[i].append(r[2] * 1000)
            ref, got = normalize_text(full[0]).split(), normalize_text(short[0]).split()
            words += len(ref)
            hits += matched(ref, got)
            same += full[0] == short[0]
        e, dd = [statistics.median(x) for x in enc], [statistics.median(x) for x in dec_s]
        totals += (e[0] + dd[0], e[1] + dd[1], words, hits)
        print(f"| {cut:g} | {n} | {e[0]:.0f} / {e[1]:.0f} | {dd[0]:.0f} / {dd[1]:.0f} | {hits} of {words} | "
              f"{same} of {len(clips)} |", flush=True)  # fmt: skip
    print(f"\nall cuts: a partial's median time {totals[1] / totals[0]:.2f}x the full window's; "
          f"{totals[3]:.0f} of {totals[2]:.0f} words matched")  # fmt: skip


if __name__ == "__main__":
    main()
