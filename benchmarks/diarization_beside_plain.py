"""A plain transcription's latency beside long diarized_json requests: what heavy diarization costs its neighbours.

    python benchmarks/diarization_beside_plain.py --diarized 4 --minutes 10 --repeats 5 --transcription-only

For each server (--server: serve's flags, once per server, the servers one after the other): the
plain request (--plain, default the 11 s JFK clip, response_format=json) alone, --repeats times before and after;
then --diarized recordings of --minutes each (tests/helpers/conversations.py's assemble(): four speakers taking
turns, a seed per recording) sent at once as diarized_json, and the plain request sent again and again, one at a
time and at most one every --interval s, until the last diarized answer is back. The plain requests beside them
are split by what ran beside them: the long requests' transcription (they started before the engine last held two
or more windows, which the one-window plain request alone never does; /metrics polled every 0.5 s), or only their
diarization after it. For each part: the median, the slowest, and the median over alone (the median of all the
alone runs); last, the slowest diarized request's own time. `--transcription-only` adds a row, on the last server,
with the same long recordings as verbose_json with word timestamps (the transcription a diarized request runs,
without its speakers): what sharing the engine's batch alone costs the plain request.

The default settings are the old behaviour (`--diarization-nice 0 --no-diarization-process`: the diarization models
in threads of the server's process, at the engine's priority) against the new one (the defaults: a process of
their own at the lowest priority). The models load at start-up (--diarization-preload) and one short request of
each kind runs first, untimed.
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.conversations import FOUR, RATE, assemble
from tests.helpers.data import DATA
from tests.helpers.server import spawn_or_exit

TIMEOUT_S = 1800
POLL_S = 0.5  # how often EngineLoad reads /metrics
OLD = "--diarization-nice 0 --no-diarization-process"  # the diarization models as before: threads at the engine's priority


def wav(samples) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def post(url: str, name: str, data: bytes, response_format: str, words: bool = False, chunking: bool = False) -> float:
    """Seconds from sending the upload to the end of its answer (a non-200 ends the script)."""
    fields = {"model": "whisper-1", "response_format": response_format}
    if words:
        fields["timestamp_granularities[]"] = "word"
    if chunking:
        fields["chunking_strategy"] = "auto"
    start = time.perf_counter()
    r = httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (name, data)}, data=fields, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    if r.status_code != 200:
        raise SystemExit(f"{response_format} answered {r.status_code}: {r.text[:300]}")
    return seconds


class EngineLoad:
    """Polls the server's /metrics: the last time the engine held two or more windows (running or waiting), which
    the one-window plain request alone never does: until then the long requests were still transcribing."""

    def __init__(self, url: str) -> None:
        self.url, self.busy_until, self.stopped = url, 0.0, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopped.wait(POLL_S):
            text = httpx.get(f"{self.url}/metrics", timeout=30).text
            windows = sum(
                float(m) for m in re.findall(r"^whisper_(?:running_sequences|queue_depth) (\S+)$", text, re.MULTILINE)
            )
            if windows >= 2:
                self.busy_until = time.perf_counter()

    def stop(self) -> float:
        self.stopped.set()
        self.thread.join()
        return self.busy_until


def beside(
    url: str, plain: tuple[str, bytes], long: list[bytes], response_format: str, interval: float, chunking: bool
):
    """Plain requests one at a time, one starting every `interval` s at most, while the long requests run: the
    (start, end) of each that ran beside them throughout, the end of the long requests' transcription, and the
    slowest long request's own time."""
    times: list[float] = [0.0] * len(long)

    def send(i: int) -> None:
        times[i] = post(url, f"long{i}.wav", long[i], response_format, response_format == "verbose_json", chunking)

    load = EngineLoad(url)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(long))]
    for t in threads:
        t.start()
    spans = []
    while any(t.is_alive() for t in threads):
        start = time.perf_counter()
        seconds = post(url, *plain, "json")
        if any(t.is_alive() for t in threads):
            spans.append((start, start + seconds))
        time.sleep(max(0.0, start + interval - time.perf_counter()))
    for t in threads:
        t.join()
    return spans, load.stop(), max(times)


def summary(times: list[float], alone: float) -> str:
    if not times:
        return "- | - | - |"
    return f"{statistics.median(times):.2f} | {max(times):.2f} | {statistics.median(times) / alone:.1f}x |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", action="append", dest="settings", metavar="FLAGS",
                    help="serve's flags for one server, repeated for each (default: the old behaviour, then the new; "
                    "write a single flag as --server=--flag)")  # fmt: skip
    ap.add_argument("--diarized", type=int, default=4, help="long diarized_json requests at once")
    ap.add_argument("--minutes", type=float, default=10.0, help="length of each long recording")
    ap.add_argument("--plain", default="g1_en_jfk.flac", help="the plain request's clip (tests/data)")
    ap.add_argument("--repeats", type=int, default=5, help="plain requests alone, before and after (their median)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds from one plain request's start to the next's")
    ap.add_argument(
        "--chunking", action="store_true", help="the long requests with chunking_strategy=auto (OpenAI asks for it)"
    )
    ap.add_argument(
        "--transcription-only",
        action="store_true",
        help="also, on the last server, the long requests as verbose_json with word timestamps, no diarization",
    )
    args = ap.parse_args()
    args.settings = args.settings or [OLD, ""]

    plain = (args.plain, (DATA / args.plain).read_bytes())
    long = [wav(assemble(FOUR, args.minutes * 60, seed=i)[0]) for i in range(args.diarized)]
    short = wav(assemble(FOUR, 20, seed=99)[0])
    rows = []
    for n, flags in enumerate(args.settings, 1):
        server = spawn_or_exit(f"--diarization-preload {flags}")
        try:
            post(server.url, "warm.wav", short, "diarized_json")
            post(server.url, *plain, "json")
            alone = [post(server.url, *plain, "json") for _ in range(args.repeats)]
            last = n == len(args.settings)
            kinds = ["diarized_json"] + (["verbose_json"] if args.transcription_only and last else [])
            for kind in kinds:
                spans, transcribed, slowest = beside(server.url, plain, long, kind, args.interval, args.chunking)
                alone += [post(server.url, *plain, "json") for _ in range(args.repeats)]
                first = [end - start for start, end in spans if start <= transcribed]
                then = [end - start for start, end in spans if start > transcribed]
                rows.append((flags or "(defaults)", kind, statistics.median(alone), first, then, slowest))
                print(f"{flags or '(defaults)'} {kind}: alone {alone}, beside the transcription "
                      f"{[round(t, 2) for t in first]}, then {[round(t, 2) for t in then]}, long requests "
                      f"{slowest:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
        finally:
            server.stop()

    print(f"\n{args.diarized} x {args.minutes:g} min beside `{args.plain}` (json, one at a time, at most one every "
          f"{args.interval:g} s), {len(args.settings)} servers in turn")  # fmt: skip
    print(
        "| server flags | long requests | plain alone s | beside their transcription: median s | max s | median / "
        "alone | beside their diarization only: median s | max s | median / alone | slowest long request s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for flags, kind, alone, first, then, slowest in rows:
        what = "diarized_json" if kind == "diarized_json" else "verbose_json, words (no diarization)"
        print(f"| `{flags}` | {args.diarized} x {what} | {alone:.2f} | {summary(first, alone)} "
              f"{summary(then, alone)} {slowest:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
