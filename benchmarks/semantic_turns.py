"""semantic_vad against server_vad on sentences with a pause in the middle, over the Realtime API, same run.

    python benchmarks/semantic_turns.py --spawn "--model tiny.en"

A conversation of the LibriSpeech clips in tests/data: each clip is cut at its quietest 100 ms within 1 s of its
middle (between two words, mid-sentence), `--pause-s` of silence is inserted there (a speaker who hesitates), and
`--gap-s` of silence follows it (the agent answering). The same conversation is streamed in real time, in 100 ms
chunks of 24 kHz PCM, by one session per turn detection, all at once on one server: server_vad with
`--silence-ms` and semantic_vad at each eagerness. Per turn detection:
- split at the pause: utterances whose turn ended in the inserted pause, out of all; other ends inside: turns
  ended inside an utterance elsewhere (a clip of two sentences, or a reader's own long pause at a comma);
- merged: utterances whose turn did not end before the next utterance's speech began (a patient eagerness that
  heard the end as unfinished and waited across the gap);
- turn-end latency: from the moment the chunk holding the utterance's last speech (Silero's last 32 ms frame of
  speech in the clip) was sent to `input_audio_buffer.speech_stopped`, and to `input_audio_buffer.committed`, for
  the utterances whose turn ended in their gap; p50 / p95.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.conversations import quiet_cut
from tests.helpers.realtime import CHUNK_MS, resample
from tests.helpers.server import spawn_or_exit

RATE = 16000
CLIPS = sorted(p for p in (ROOT / "tests" / "data").glob("g1_en_librispeech-*") if p.suffix in (".wav", ".flac"))
EAGERNESS = ("low", "medium", "high")


def speech_bounds(audio: np.ndarray, vad) -> tuple[int, int]:
    """The first and last sample of Silero's speech frames (probability >= 0.5) in `audio`."""
    probs = np.array(vad.speech_probs(audio))
    speech = np.flatnonzero(probs >= 0.5)
    return int(speech[0]) * 512, (int(speech[-1]) + 1) * 512


def conversation(pause_s: float, gap_s: float) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """(16 kHz stream, [(speech start, pause start, speech end)] per utterance, in stream samples)."""
    from engine import VoiceActivityDetector, decode_audio

    vad = VoiceActivityDetector()
    pieces, utterances, at = [np.zeros(RATE, np.float32)], [], RATE
    for path in CLIPS:
        audio = decode_audio(path)
        start, end = speech_bounds(audio, vad)
        cut = quiet_cut(audio, (start + end) // 2)
        pause = int(pause_s * RATE)
        utterances.append((at + start, at + cut, at + end + pause))
        pieces += [audio[:cut], np.zeros(pause, np.float32), audio[cut:], np.zeros(int(gap_s * RATE), np.float32)]
        at += len(audio) + pause + int(gap_s * RATE)
    return np.concatenate(pieces), utterances


def stream(url: str, turn_detection: dict, pcm: bytes, t0: float, out: dict) -> None:
    """One session streaming `pcm` in real time from `t0`; `out` gets when each chunk was sent and the
    speech_stopped / committed events as (arrival time, audio_end_ms or None)."""
    from websockets.sync.client import connect

    step = CHUNK_MS * 48
    sent, events = [], []
    with connect(url.replace("http", "ws", 1) + "/v1/realtime?intent=transcription", max_size=2**24) as ws:
        json.loads(ws.recv())
        ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "turn_detection": turn_detection}}}}))  # fmt: skip

        def read() -> None:
            for message in ws:
                ev = json.loads(message)
                if ev["type"] == "error":
                    out["errors"] = out.get("errors", 0) + 1
                elif ev["type"] in ("input_audio_buffer.speech_stopped", "input_audio_buffer.committed"):
                    events.append((ev["type"], time.perf_counter(), ev.get("audio_end_ms")))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for i in range(0, len(pcm), step):
            time.sleep(max(0.0, t0 + len(sent) * CHUNK_MS / 1000 - time.perf_counter()))
            ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step]).decode()})
            )
            sent.append(time.perf_counter())
        time.sleep(3.0)  # the last turn's decode and events
    reader.join(timeout=5)
    out.update(sent=sent, events=events)


def measure(out: dict, utterances: list[tuple[int, int, int]], pause: int) -> dict:
    stops = [(t, end_ms * RATE // 1000) for kind, t, end_ms in out["events"] if kind.endswith("speech_stopped")]
    commits = [t for kind, t, _ in out["events"] if kind.endswith("committed")]
    split = inside = merged = 0
    to_stop, to_commit = [], []
    for k, (start, cut, end) in enumerate(utterances):
        following = utterances[k + 1][0] if k + 1 < len(utterances) else float("inf")
        # the speech before the cut may stop short of it (the cut is the middle of the quietest 100 ms near there)
        at_pause = [at for _, at in stops if cut - RATE <= at <= cut + pause + 3 * 512]
        split += bool(at_pause)
        inside += sum(start < at < end - 3 * 512 for _, at in stops) - len(at_pause)
        ended = [(t, i) for i, (t, at) in enumerate(stops) if end - 3 * 512 <= at < following]
        if not ended:
            merged += 1
            continue
        t, i = ended[0]
        sent = out["sent"][min(end // (CHUNK_MS * RATE // 1000), len(out["sent"]) - 1)]
        to_stop.append(t - sent)
        if i < len(commits):
            to_commit.append(commits[i] - sent)
    return {
        "split": split,
        "inside": inside,
        "merged": merged,
        "turns": len(commits),
        "stop": to_stop,
        "commit": to_commit,
    }


def pct(values: list[float], q: int) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spawn", nargs="?", const="", default=None, help="start `python -m server serve SPAWN`")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--pause-s", type=float, default=1.2, help="silence inserted mid-sentence")
    ap.add_argument("--gap-s", type=float, default=3.0, help="silence after each utterance")
    ap.add_argument("--silence-ms", type=int, default=500, help="server_vad's silence_duration_ms")
    args = ap.parse_args()
    audio, utterances = conversation(args.pause_s, args.gap_s)
    pcm = (np.clip(resample(audio, RATE, 24000), -1, 1) * 32767).round().astype("<i2").tobytes()
    configs = {f"server_vad {args.silence_ms} ms": {"type": "server_vad", "silence_duration_ms": args.silence_ms}}
    configs |= {f"semantic_vad {e}": {"type": "semantic_vad", "eagerness": e} for e in EAGERNESS}
    server = spawn_or_exit(args.spawn) if args.spawn is not None else None
    url = server.url if server else args.url
    try:
        print(f"{len(utterances)} utterances (LibriSpeech clips in tests/data), each with {args.pause_s:g} s of "
              f"silence inserted mid-sentence and {args.gap_s:g} s after it: {len(audio) / RATE:.0f} s streamed in "
              f"real time by {len(configs)} sessions at once")  # fmt: skip
        outs = {name: {} for name in configs}
        t0 = time.perf_counter() + 1.0
        threads = [threading.Thread(target=stream, args=(url, td, pcm, t0, outs[name])) for name, td in configs.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print("| turn detection | split at the pause | other ends inside | merged with the next | turns | speech end -> speech_stopped "
              "p50 / p95 s | speech end -> committed p50 / p95 s | errors |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for name in configs:
            m = measure(outs[name], utterances, int(args.pause_s * RATE))
            print(f"| {name} | {m['split']} of {len(utterances)} | {m['inside']} | {m['merged']} | {m['turns']} "
                  f"| {pct(m['stop'], 50):.2f} / {pct(m['stop'], 95):.2f} "
                  f"| {pct(m['commit'], 50):.2f} / {pct(m['commit'], 95):.2f} | {outs[name].get('errors', 0)} |")  # fmt: skip
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    main()
