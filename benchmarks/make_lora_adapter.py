"""Make a LoRA adapter (PEFT format, trained with peft) that makes a model transcribe one clip as the text you give,
to try the server's adapter support with an adapter whose effect shows in the transcript.

    python benchmarks/make_lora_adapter.py --model tiny.en --audio tests/data/g1_en_jfk.flac \
        --text "And so, my fellow Americans, ask not what your community can do for you, ask what you can do for your community." \
        --out /tmp/community [--merged-out /tmp/community-merged]

Needs the test extra (peft, transformers). The adapter is built once under $WHISPER_TEST_CACHE (default
~/.cache/whisper-server-tests; tests/helpers/lora.py) and copied to --out; --merged-out also writes the model with
the adapter merged into its weights, a model path the server loads, which must say the same as the adapter.
Prints the adapter's folder (and the merged model's).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en", help="a model name the server takes (tiny.en, base, ...)")
    parser.add_argument("--audio", required=True, help="an audio file of at most 30 s")
    parser.add_argument("--text", required=True, help="what the adapted model should say for it")
    parser.add_argument("--out", required=True, type=Path, help="the adapter's folder (made; files in it replaced)")
    parser.add_argument("--merged-out", type=Path, help="also write the model with the adapter merged in here")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--decoder-only", action="store_true", help="adapt the decoder's layers only")
    parser.add_argument("--steps", type=int, default=40, help="the most AdamW steps (it stops once the text wins)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from engine.audio.uploads import decode_audio
    from tests.helpers.lora import merged_model, trained_adapter

    start = time.perf_counter()
    adapter = trained_adapter(
        args.model, decode_audio(args.audio), args.text, rank=args.rank, alpha=args.alpha,
        encoder=not args.decoder_only, steps=args.steps, seed=args.seed,
    )  # fmt: skip
    shutil.copytree(adapter, args.out, dirs_exist_ok=True)
    print(f"adapter ({time.perf_counter() - start:.1f} s, cached in {adapter}):", file=sys.stderr)
    print(args.out.resolve())
    if args.merged_out:
        shutil.copytree(merged_model(adapter), args.merged_out, dirs_exist_ok=True)
        print("merged model:", file=sys.stderr)
        print(args.merged_out.resolve())


if __name__ == "__main__":
    main()
