"""Many realtime sessions held open at once: the server's memory and its /health latency while they connect, sit
idle and while some of them speak.

    python benchmarks/realtime_idle.py --spawn "--model tiny.en --realtime-max-sessions 1100" --idle 1000 --speaking 4
    python benchmarks/realtime_idle.py --url http://127.0.0.1:8000 --idle 1000 --speaking 256

`--idle` sessions connect to /v1/realtime?intent=transcription (from one asyncio client, `--connect-rate` a
second), each sends a session.update (server VAD, OpenAI's defaults) and then nothing: a voice agent's connection
between calls; with `--silence` each streams silence in real time instead (an open microphone). With them
held, `--speaking` more sessions stream a LibriSpeech clip in real time as benchmarks/realtime_sessions.py does
(0.5 s of silence, the clip, 1.5 s of silence) and wait for its transcript. Throughout, /health is asked every
100 ms on a fresh connection. Prints, per phase (before, while the idle sessions connect, with them held, while the
others speak, after all closed): the server's resident memory (the process and its children, from /proc: run it on
the server's machine) and /health's latency p50 / p95 / max; then the speaking sessions' completed transcripts and
their p50 / p95 after the commit and speech_stopped lag (realtime_sessions.py's). With `--silence` and the server's
process known, also the server's CPU time per append while the idle sessions are held, in its own process and in
its children: what one open microphone costs, and so how many one process can hear. The server's
--realtime-max-sessions must admit them all.
Target (issue: realtime for voice agents): memory bounded, /health under 100 ms throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.realtime_sessions import pct
from benchmarks.realtime_sessions import run as speak
from tests.helpers.realtime import pcm24k
from tests.helpers.server import process_tree, spawn_or_exit, tree_rss_mib

HEALTH_TARGET_S = 0.1
CLIP = ROOT / "tests" / "data" / "g1_en_librispeech-test-clean_1221-135766-0001.wav"


def probe_health(host: str, port: int, stop, samples) -> None:
    """GET /health every 100 ms on a fresh connection until `stop` is set; (when, seconds or None) into `samples`.
    It runs in its own process: in the client's, its thread would wait for the GIL behind the asyncio client's
    handshakes and sends, and time those too."""
    while not stop.is_set():
        start = time.perf_counter()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
        except OSError:
            ok = False
        samples.put((time.time(), time.perf_counter() - start if ok else None))
        stop.wait(max(0.0, 0.1 - (time.perf_counter() - start)))


class HealthProbe:
    """probe_health in a child process; latencies grouped by the phase the parent had marked when each was asked."""

    def __init__(self, url: str):
        address = urllib.parse.urlsplit(url)
        self.stop, self.samples = multiprocessing.Event(), multiprocessing.Queue()
        self.process = multiprocessing.Process(
            target=probe_health, args=(address.hostname, address.port, self.stop, self.samples), daemon=True
        )
        self.marks: list[tuple[float, str]] = []
        self.latencies: dict[str, list[float]] = {}
        self.failures: dict[str, int] = {}

    def start(self) -> None:
        self.process.start()

    def mark(self, phase: str) -> None:
        self.marks.append((time.time(), phase))

    def finish(self) -> None:
        self.stop.set()
        samples = []
        while self.process.is_alive() or not self.samples.empty():
            try:
                samples.append(self.samples.get(timeout=0.5))
            except queue.Empty:
                continue
        self.process.join()
        for when, seconds in samples:
            phase = next((name for at, name in reversed(self.marks) if at <= when), self.marks[0][1])
            if seconds is None:
                self.failures[phase] = self.failures.get(phase, 0) + 1
            else:
                self.latencies.setdefault(phase, []).append(seconds)


async def hold_idle(
    url: str, n: int, rate: float, connected: threading.Event, release: threading.Event, out: dict, silence: bool
) -> None:
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    update = json.dumps({"type": "session.update", "session": {"type": "transcription"}})
    sockets, errors = [], []

    async def one() -> None:
        try:
            ws = await connect(ws_url, max_size=2**22, open_timeout=60)
            await ws.send(update)
            sockets.append(ws)
        except Exception as exc:  # noqa: BLE001 - counted, not fatal
            errors.append(repr(exc))

    start = time.perf_counter()
    wave = max(1, round(rate / 10))
    for i in range(0, n, wave):  # clients arriving at `rate` a second, in waves ten times a second
        await asyncio.gather(*(one() for _ in range(min(wave, n - i))))
        await asyncio.sleep(max(0.0, start + (i + wave) / rate - time.perf_counter()))
    out["connect_s"], out["connected"], out["errors"] = time.perf_counter() - start, len(sockets), errors
    connected.set()
    # each open microphone sends 100 ms of silence every 100 ms (one asyncio client for all: as many sends)
    chunk = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()})
    late = 0.0
    start = time.perf_counter()
    tick = 0
    while not release.is_set():
        tick += 1
        if silence:
            await asyncio.gather(*(ws.send(chunk) for ws in sockets), return_exceptions=True)
            out["sent"] = out.get("sent", 0) + len(sockets)
        late = max(late, time.perf_counter() - (start + (tick - 1) * 0.1))
        await asyncio.sleep(max(0.0, start + tick * 0.1 - time.perf_counter()))
    out["client_late_s"] = late
    open_at_release = sum(1 for ws in sockets if ws.state.name == "OPEN")
    out["open_at_release"] = open_at_release
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The server's CPU seconds so far (user and system, Linux /proc): its own process's, and its descendants'."""
    tick = os.sysconf("SC_CLK_TCK")

    def used(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime and stime, stat's 14th and 15th fields

    descendants = 0.0
    for p in process_tree(pid):
        if p == pid:
            continue
        try:
            descendants += used(p)
        except OSError:  # gone meanwhile
            continue
    return used(pid), descendants


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spawn", nargs="?", const="", default=None, help="start `python -m server serve SPAWN`")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, help="the server's process id (with --url; --spawn knows it)")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--speaking", type=int, default=4)
    ap.add_argument("--hold-s", type=float, default=10.0, help="how long the idle sessions sit before others speak")
    ap.add_argument("--silence", action="store_true", help="the idle sessions stream silence in real time")
    ap.add_argument("--connect-rate", type=float, default=200.0, help="idle sessions connecting per second")
    args = ap.parse_args()
    server = spawn_or_exit(args.spawn) if args.spawn is not None else None
    url = server.url if server else args.url
    pid = server.proc.pid if server else args.pid
    rss: dict[str, float] = {}

    def mark(phase: str) -> None:
        probe.mark(phase)
        if pid:
            rss[phase] = tree_rss_mib(pid)

    probe = HealthProbe(url)
    probe.start()
    try:
        time.sleep(2)
        mark("before")
        connected, release, held = threading.Event(), threading.Event(), {}
        mark("connecting")
        idle = threading.Thread(
            target=asyncio.run,
            args=(hold_idle(url, args.idle, args.connect_rate, connected, release, held, args.silence),),
        )
        idle.start()
        connected.wait()
        mark("held idle")
        cpu_before, sent_before = (cpu_seconds(pid), held.get("sent", 0)) if pid and args.silence else (None, 0)
        time.sleep(args.hold_s)
        if cpu_before is not None:  # what one open microphone's append costs the server, in each of its processes
            sent = held.get("sent", 0) - sent_before
            per_append = [(b - a) / max(sent, 1) * 1e6 for a, b in zip(cpu_before, cpu_seconds(pid))]
        rss["held idle"] = tree_rss_mib(pid) if pid else float("nan")
        mark("speaking")
        pcm = pcm24k(CLIP)
        out, errors = speak(url, pcm, args.speaking) if args.speaking else ([], [])
        rss["speaking"] = tree_rss_mib(pid) if pid else float("nan")
        release.set()
        idle.join()
        mark("after")
        time.sleep(3)
        rss["after"] = tree_rss_mib(pid) if pid else float("nan")
    finally:
        probe.finish()
        if server:
            server.stop()
    what = "streaming silence" if args.silence else "idle"
    print(f"{args.idle} {what} sessions: {held['connected']} connected in {held['connect_s']:.1f} s "
          f"({len(held['errors'])} refused{': ' + held['errors'][0] if held['errors'] else ''}), "
          f"{held.get('open_at_release', 0)} still open when released; the client's sends up to "
          f"{held.get('client_late_s', 0):.2f} s late")  # fmt: skip
    print("| phase | server RSS MiB | /health p50 / p95 / max ms | /health failures |\n|---|---|---|---|")
    for phase in ("before", "connecting", "held idle", "speaking", "after"):
        lat = [x * 1000 for x in probe.latencies.get(phase, [])]
        p50, p95 = (np.percentile(lat, 50), np.percentile(lat, 95)) if lat else (float("nan"),) * 2
        print(f"| {phase} | {rss.get(phase, float('nan')):.0f} | {p50:.1f} / {p95:.1f} / {max(lat, default=float('nan')):.1f} | "
              f"{probe.failures.get(phase, 0)} |")  # fmt: skip
    worst = max((x for v in probe.latencies.values() for x in v), default=float("nan"))
    print(f"/health worst {worst * 1000:.1f} ms (target < {HEALTH_TARGET_S * 1000:.0f} ms): "
          f"{'met' if worst < HEALTH_TARGET_S and not probe.failures else 'NOT met'}")  # fmt: skip
    if args.silence and pid:
        print(f"server CPU per append while held ({sent:g} appends): {per_append[0]:.0f} us in its own process (the "
              f"event loop, the appends' decoding, Silero where it runs in a thread), {per_append[1]:.0f} us in its "
              f"child processes (Silero where it runs in one, the engine)")  # fmt: skip
    if args.speaking:
        after = [o[1] for o in out]
        print(f"{args.speaking} speaking beside them: {len(out)} completed, {len(errors)} failed; after the commit "
              f"p50 {statistics.median(after) if after else float('nan'):.3f} s / "
              f"p95 {np.percentile(after, 95) if after else float('nan'):.3f} s; speech_stopped lag p50 / p95 "
              f"{pct([o[6] for o in out], 50):.3f} / {pct([o[6] for o in out], 95):.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
