"""keywords[]: how often the given names and terms come out spelled right, and what the biasing costs elsewhere.

    python benchmarks/keywords.py [--model tiny.en]

Speech with rare names and jargon is made with espeak-ng (Debian's `espeak-ng`; a synthetic voice, harder than a
person), one sentence per case with the keywords it holds. Four ways to decode each: no keywords, the keywords in
the prompt only (faster-whisper's hotwords), the logit bonus only (engine/decoding/keywords.py; the server's default),
both (`keywords_in_prompt`). Prints each way's keyword recall (keywords found verbatim, ignoring case, over
keywords spoken) and the WER on the LibriSpeech clips of tests/data decoded with every case's keywords as
distractors (it should not rise). Engine level, CPU.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data"

CASES = [
    ("Yesterday I met Siobhan Nakamura and Bartholomew Quixley to discuss the Kubernetes migration.",
     ["Siobhan Nakamura", "Bartholomew Quixley", "Kubernetes"]),
    ("The Nginx ingress controller forwards traffic to the Grafana dashboard.", ["Nginx", "Grafana"]),
    ("Please ask Dr. Oyelaran about the Xanthopoulos account before Thursday.", ["Oyelaran", "Xanthopoulos"]),
    ("We deployed PostgreSQL with Patroni and pgBouncer in the Frankfurt region.", ["PostgreSQL", "Patroni",
                                                                                     "pgBouncer"]),
    ("Aoife Ni Bhriain will present the Zyrtec results to the Vandermeer committee.", ["Aoife", "Zyrtec",
                                                                                        "Vandermeer"]),
    ("The patient was prescribed levothyroxine and metoprolol by Doctor Okonkwo.", ["levothyroxine", "metoprolol",
                                                                                    "Okonkwo"]),
    ("Our Terraform modules provision the Kafka brokers and the Istio service mesh.", ["Terraform", "Kafka",
                                                                                       "Istio"]),
    ("Captain Ilyasova docked the Thessaly at Port Mirabeau after the storm.", ["Ilyasova", "Thessaly",
                                                                                "Mirabeau"]),
]  # fmt: skip

WAYS = {  # name: (keyword_bias, keywords_in_prompt)
    "none": None,
    "prompt only": (0.0, True),
    "bonus only (the default)": (1.0, False),
    "both (keywords_in_prompt)": (1.0, True),
}


def synthesize(text: str, out: Path) -> None:
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(out), text], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    args = ap.parse_args()
    import jiwer

    from engine import DecodeOptions, Engine, EngineConfig, EngineError
    from engine.audio.uploads import decode_audio
    from tests.helpers.transcripts import normalize_english as normalize

    engine = Engine(EngineConfig(model=args.model, device="cpu"))
    engine.start()
    tmp = Path(tempfile.mkdtemp())
    speech = []
    for i, (text, keywords) in enumerate(CASES):
        synthesize(text, tmp / f"{i}.wav")
        speech.append((decode_audio(tmp / f"{i}.wav"), keywords))
    with open(DATA / "MANIFEST.tsv", newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if "librispeech" in r["file"] and r["language"] == "en"]
    clips = [(decode_audio(DATA / r["file"]), r["reference_text"]) for r in rows]
    distractors = tuple(k for _, keywords in CASES for k in keywords)

    def options(way, keywords) -> DecodeOptions:
        if WAYS[way] is None:
            return DecodeOptions()
        bias, in_prompt = WAYS[way]
        return DecodeOptions(keywords=tuple(keywords), keyword_bias=bias, keywords_in_prompt=in_prompt)

    print(f"{args.model}, {len(CASES)} synthetic sentences ({sum(len(k) for _, k in CASES)} keywords), "
          f"{len(clips)} LibriSpeech clips with {len(distractors)} distractor keywords")  # fmt: skip
    print("| keywords | recall | WER on LibriSpeech | requests failed |")
    print("|---|---|---|---|")
    for way in WAYS:
        found = total = failed = 0

        def text(audio, keywords, way=way) -> str:
            nonlocal failed
            try:
                return engine.transcribe(audio, options(way, keywords)).text
            except EngineError:  # the decode budget: the keywords derailed the window into fallbacks
                failed += 1
                return ""

        for audio, keywords in speech:
            out = text(audio, keywords).lower()
            found += sum(k.lower() in out for k in keywords)
            total += len(keywords)
        hyps = [normalize(text(a, distractors[:12])) for a, _ in clips]
        wer = jiwer.wer([normalize(ref) for _, ref in clips], hyps)
        print(f"| {way} | {found}/{total} ({found / total:.0%}) | {wer:.2%} | {failed} |", flush=True)
    engine.shutdown()


if __name__ == "__main__":
    main()
