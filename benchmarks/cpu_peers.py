"""CPU single-request latency: this engine vs faster-whisper float32 vs transformers generate, same run.

    python benchmarks/cpu_peers.py [--model tiny.en] [--repeats 3] [--rounds 3] [--threads 2]

Model load is excluded; each figure is the median of --repeats runs of features + encoder + greedy
decode without timestamps. All three get the same features and prompt and must emit the same tokens (the
table says so). Each system runs in its own child process, one after the other: thread pools left
spinning by one library (OpenMP, CTranslate2) would otherwise slow the next on a small machine. --rounds
repeats the three processes in turn (ours, faster-whisper, transformers, ours, ...) and reports the median over
rounds, so a slow minute on a shared machine lands on every system rather than on one.
Prints a table and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data"
CLIPS = {
    "LibriSpeech 16.7 s": "g1_en_librispeech-test-clean_1221-135766-0001.wav",
    "spontaneous 26.7 s": "g1_en_spontaneous_mfa-acoustic-corpus.wav",
}


def ct2_model_dir(resolved, tmp: Path) -> Path:
    """The packaged CTranslate2 model as faster-whisper wants it: one model.bin (the package splits it in parts)."""
    ct2_dir = tmp / "ct2"
    ct2_dir.mkdir()
    for f in resolved.config_dir.iterdir():
        if f.suffix in (".json", ".txt"):
            (ct2_dir / f.name).write_bytes(f.read_bytes())
    with open(ct2_dir / "model.bin", "wb") as out:
        for part in resolved.weight_files:
            out.write(part.read_bytes())
    return ct2_dir


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--only", choices=["ours", "faster-whisper", "transformers"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only is None:
        systems = ("ours", "faster-whisper", "transformers")
        rounds: dict[str, list[dict]] = {s: [] for s in systems}
        for _ in range(args.rounds):
            for system in systems:
                out = subprocess.run(
                    [sys.executable, __file__, *sys.argv[1:], "--only", system], check=True, capture_output=True, text=True
                ).stdout
                rounds[system].append(json.loads(out.strip().splitlines()[-1]))
        times = {s: {c: statistics.median(r["times"][c] for r in rounds[s]) for c in CLIPS} for s in systems}
        # A ratio is taken within a round (the three systems ran minutes apart at most), then the median over
        # rounds: on a machine whose speed drifts, this is steadier than a ratio of medians taken across rounds.
        def ratios(peer: str, label: str) -> str:
            r = sorted(p["times"][label] / o["times"][label] for p, o in zip(rounds[peer], rounds["ours"]))
            return f"{statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})"

        print(f"\nmodel {args.model}, {args.threads} threads, median of {args.repeats} runs x {args.rounds} interleaved rounds, load excluded")
        print("| clip | tokens | this engine (s) | faster-whisper fp32 (s) | transformers (s) | fw / ours | hf / ours |")
        print("|---|---|---|---|---|---|---|")
        for label in CLIPS:
            tokens = {s: rounds[s][0]["tokens"][label] for s in systems}
            same = "same" if tokens["faster-whisper"] == tokens["ours"] == tokens["transformers"] else "DIFFER"
            o, f, h = (times[s][label] for s in systems)
            n = len(tokens["ours"])
            fw, hf = ratios("faster-whisper", label), ratios("transformers", label)
            print(f"| {label} | {n} ({same}) | {o:.3f} | {f:.3f} | {h:.3f} | {fw} | {hf} |")
        print("times: median over rounds; ratios: median (range) of the per-round ratios")
        return
    torch.set_num_threads(args.threads)

    from faster_whisper import WhisperModel
    from transformers import WhisperForConditionalGeneration

    from engine.audio.features import LogMelSpectrogram, batch_features
    from engine.audio.uploads import decode_audio
    from engine.config import EngineConfig
    from engine.model.tokenizer import Tokenizer
    from engine.model.weights import load_checkpoint, resolve_model
    from engine.request import DecodeOptions
    from engine.runtime.engine import Engine
    from tests.helpers.weights_export import write_hf_export

    resolved = resolve_model(args.model)
    audios = {label: decode_audio(args.data / name) for label, name in CLIPS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only == "ours":
            engine = Engine(EngineConfig(model=args.model, device="cpu", num_threads=args.threads))
            engine.start()
            options = DecodeOptions(without_timestamps=True, temperatures=(0.0,))

            def run(audio):
                return [t for s in engine.transcribe(audio, options).segments for t in s.tokens]

        elif args.only == "faster-whisper":
            fw = WhisperModel(str(ct2_model_dir(resolved, Path(tmp))), device="cpu", compute_type="float32",
                              cpu_threads=args.threads)  # fmt: skip

            def run(audio):
                segments, _ = fw.transcribe(audio, beam_size=1, temperature=0, without_timestamps=True, vad_filter=False)
                return [t for s in segments for t in s.tokens]

        else:
            checkpoint = load_checkpoint(resolved)
            hf_dir = write_hf_export(checkpoint, Path(tmp) / "hf")
            hf = WhisperForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
            dims = checkpoint.dims
            tok = Tokenizer.from_file(resolved.config_dir / "tokenizer.json", dims.num_languages, dims.is_multilingual)
            # the same log-mel (transformers' own extractor pads the audio before the log-mel, which changes the
            # features and so the transcript) and the same prompt: all three systems decode the same tokens
            log_mel = LogMelSpectrogram(dims.n_mels)
            prompt = torch.tensor([tok.sot_sequence("en", "transcribe") + [tok.no_timestamps]])

            def run(audio):
                with torch.inference_mode():
                    ids = hf.generate(
                        batch_features([audio], log_mel), decoder_input_ids=prompt, num_beams=1, do_sample=False,
                        max_new_tokens=440,
                    )[0].tolist()
                return [t for t in ids if t < tok.eot]

        tokens = {label: run(audio) for label, audio in audios.items()}
        times = {label: median_time(lambda: run(audio), args.repeats) for label, audio in audios.items()}
    print(json.dumps({"times": times, "tokens": tokens}))

if __name__ == "__main__":
    main()
