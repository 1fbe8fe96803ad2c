"""Soak test of a server over HTTP: N requests, C at a time, good and bad ones mixed; memory and /health watched.

    python benchmarks/soak.py --spawn "" --requests 80 --concurrency 8
    python benchmarks/soak.py --url http://127.0.0.1:8000 --requests 2000 --concurrency 32 --seed 1
    python benchmarks/soak.py --spawn "--max-upload-mb 2" --mix json=20,oversize=5,disconnect=0

What it sends. A plan of --requests requests is drawn from --seed before the run (the same seed gives the same
requests, in the same order of submission; completion order depends on the server). Every kind with a non-zero
weight occurs at least once when --requests allows, the rest is drawn by weight (--mix overrides weights by name,
e.g. `--mix stream=30,oversize=0`). Audio is the real clips of --data-dir: the g1_ (short English) and g4_ (odd
formats: wav/aiff/flac/mp3/ogg/webm/aac/mp4/m4a, 8 kHz to 44.1 kHz, 8 to 32 bit, stereo) files, less any over the
upload limit; the hang-up clip is the longest g2_ (long-form) file under 8 MB and the limit. Kinds, and the
outcome each counts as correct:

    json, text, srt, vtt, verbose_json   a transcription in that response_format            2xx, body of that shape
    words                                verbose_json with timestamp_granularities[]=word    2xx, a `words` list
    stream                               stream=true, the SSE read to transcript.text.done   2xx, a done event
    translate                            /v1/audio/translations                              2xx; 4xx on an
                                                                                             English-only model (.en)
    chat                                 /v1/chat/completions with an input_audio part       2xx, a message
    random_bytes, empty_file             an upload that is no audio                          4xx
    truncated                            a real clip cut at 2-60 % of its bytes              2xx or 4xx
    unknown_model, bad_format, bad_temperature   a bad form field                            4xx
    not_multipart                        JSON, urlencoded, octet-stream or boundary-less     4xx
                                         multipart body to the upload route
    bad_json                             a chat body that is not valid JSON                  4xx
    oversize                             an upload 64 KiB over --max-upload-mb               4xx (or the server
                                                                                             closing the upload)
    disconnect                           a long clip; the client hangs up 1 s into the wait  no answer read (2xx if
                                                                                             it was that fast)

How to read the output. The results table has a row per kind: `ok` (correct success, or a clean hang-up for
disconnect), `exp err` (the expected 4xx), `unexpected` (any other status, or a 2xx whose body has the wrong
shape: `200 bad body`), `transport` (no HTTP status at all: a timeout after --timeout-s, a reset, a closed
connection, where the kind did not expect one) and `lost` (transport + unexpected 5xx: requests the server
failed). `statuses` lists what came back (`timeout`, `abandoned`, `ReadError`... for answers without a status);
p50/p95 are over the row's `ok` answers. The summary's latency percentiles are over the successful audio requests
(the first nine kinds), from send to the last byte (the done event for stream); throughput is over the timed
run's wall time, RTFx = audio seconds of the successful requests / wall seconds. One warm-up transcription before
the run is not counted.

Memory: a thread reads VmRSS from /proc/<pid>/status of the server process and of all its descendants (engine
process, decoder helpers) every --rss-interval-s. The table shows the series (thinned to at most 16 rows); growth
is from the first sample taken after warm-up (the warm-up request plus the first 10 % of the run) to the last,
and over the second half of that span, in MB/min: caches fill while new batch shapes turn up, so a short run
shows growth after warm-up; a server that does not leak shows ~0 over the second half of a long one. With
--spawn the pid is known; with --url it is found from the listening socket in /proc/net/tcp (same user only) or
given as --server-pid.

/health: another thread GETs it every 0.5 s during the run; p50/max latency and any non-200 are printed (a
blocked event loop shows here first). After the run the script waits up to 60 s for /metrics to show no running
or queued sequences (hung-up requests must free their slots).

Exit status: 1 if any request was lost (no answer within --timeout-s, a dropped connection, or an unexpected 5xx),
else 0, so the script can serve as a check. Other surprises (an unexpected 4xx, a wrong body) are printed with
an example but do not fail the run.

--spawn "ARGS" starts `python -m server serve ARGS --host 127.0.0.1 --port <free port>` from the repository root
(tests/helpers/server.py's RemoteServer, as benchmarks/http_load.py and the end-to-end tests do) and stops it at
the end; its log lines about unhandled errors are printed when 5xx answers came back. Write a single flag as
`--spawn=--dummy-weights`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import re
import shlex
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers.server import RemoteServer, spawn_or_exit  # noqa: E402

DATA = ROOT / "tests" / "data"
MIB = 1024 * 1024
DEFAULT_MAX_UPLOAD_MB = 25.0  # the server's default --max-upload-mb
CHAT_FORMATS = {"wav", "mp3", "flac", "ogg", "webm", "m4a", "mp4"}  # input_audio formats the server names
AUDIO_EXTS = CHAT_FORMATS | {"aiff", "aac", "opus"}
DISCONNECT_AFTER_S = 1.0
HEALTH_INTERVAL_S = 0.5
DRAIN_TIMEOUT_S = 60.0
MAX_SERIES_ROWS = 16

# Expected outcomes
OK = "2xx"
CLIENT_ERROR = "4xx"
OK_OR_CLIENT_ERROR = "2xx/4xx"
CLIENT_ERROR_OR_CLOSED = "4xx/closed"
HANG_UP = "hang-up"

DEFAULT_MIX = {
    "json": 12, "text": 5, "srt": 5, "vtt": 5, "verbose_json": 6, "words": 6, "stream": 10, "translate": 4,
    "chat": 8,
    "random_bytes": 4, "empty_file": 3, "truncated": 5, "unknown_model": 3, "bad_format": 3, "bad_temperature": 3,
    "not_multipart": 3, "bad_json": 3, "oversize": 1, "disconnect": 3,
}  # fmt: skip
EXPECT = {
    **dict.fromkeys(["json", "text", "srt", "vtt", "verbose_json", "words", "stream", "chat"], OK),
    **dict.fromkeys(["random_bytes", "empty_file", "unknown_model", "bad_format", "bad_temperature", "not_multipart",
                     "bad_json"], CLIENT_ERROR),
    "truncated": OK_OR_CLIENT_ERROR, "oversize": CLIENT_ERROR_OR_CLOSED, "disconnect": HANG_UP,
}  # translate: Planner.expect, from the model
AUDIO_KINDS = ("json", "text", "srt", "vtt", "verbose_json", "words", "stream", "translate", "chat")


@dataclass(frozen=True)
class Clip:
    name: str
    data: bytes
    seconds: float


@dataclass
class Spec:
    """One planned request: what to send and how to judge the answer."""

    kind: str
    expect: str
    path: str
    kwargs: dict[str, Any]
    seconds: float = 0.0  # audio length, for RTFx
    stream: bool = False
    check: Callable[[httpx.Response], bool] | None = None  # shape of a 2xx body


@dataclass
class Outcome:
    kind: str
    label: str  # "200", "400", "timeout", "abandoned", "ReadError", "200 bad body", ...
    verdict: str  # ok | expected | unexpected | transport
    lost: bool
    latency: float
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Samples:
    rss: list[tuple[float, int, float, float, int]] = field(default_factory=list)  # t, done, server MB, kids MB, n
    health: list[float] = field(default_factory=list)  # latency of 200s
    health_bad: Counter = field(default_factory=Counter)


# ---------------------------------------------------------------- inputs


def load_clips(data_dir: Path, max_bytes: int) -> tuple[list[Clip], Clip, int]:
    """The g1_/g4_ clips for requests, the longest g2_ clip under 8 MB (else the longest clip) for hang-ups, and
    how many were left out for being over the upload limit (they would be refused, not transcribed)."""
    manifest = data_dir / "MANIFEST.tsv"
    if not manifest.exists():
        raise SystemExit(f"no MANIFEST.tsv in {data_dir} (see --data-dir)")
    seconds = {}
    for line in manifest.read_text().splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) > 1:
            seconds[cols[0]] = float(cols[1])
    audio = sorted(n for n in seconds if n.rsplit(".", 1)[-1].lower() in AUDIO_EXTS and (data_dir / n).exists())
    size = {n: (data_dir / n).stat().st_size for n in audio}
    names = [n for n in audio if size[n] <= max_bytes]
    clips = [Clip(n, (data_dir / n).read_bytes(), seconds[n]) for n in names if n.startswith(("g1_", "g4_"))]
    if not clips:
        raise SystemExit(f"no g1_/g4_ audio clips within the upload limit in {data_dir}")
    long_ones = [n for n in names if n.startswith("g2_") and size[n] < 8 * MIB]
    longest = max(long_ones, key=seconds.get) if long_ones else max(clips, key=lambda c: c.seconds).name
    left_out = sum(n.startswith(("g1_", "g4_")) for n in audio) - len(clips)
    return clips, Clip(longest, (data_dir / longest).read_bytes(), seconds[longest]), left_out


def is_json_with(key: str, kind: type) -> Callable[[httpx.Response], bool]:
    def check(response: httpx.Response) -> bool:
        try:
            return isinstance(response.json().get(key), kind)
        except (ValueError, AttributeError):
            return False

    return check


def chat_check(response: httpx.Response) -> bool:
    try:
        return isinstance(response.json()["choices"][0]["message"]["content"], str)
    except (ValueError, KeyError, IndexError, TypeError):
        return False


CHECKS: dict[str, Callable[[httpx.Response], bool]] = {
    "json": is_json_with("text", str),
    "text": lambda r: r.headers.get("content-type", "").startswith("text/plain"),
    "srt": lambda r: r.text == "" or r.text.lstrip().startswith("1\n"),
    "vtt": lambda r: r.text.startswith("WEBVTT"),
    "verbose_json": is_json_with("segments", list),
    "words": is_json_with("words", list),
    "translate": is_json_with("text", str),
    "chat": chat_check,
}


class Planner:
    """Builds the request of a kind from that request's own seeded generator, when it is sent: the plan stays a
    list of (kind, seed), so a long run holds no bodies in memory and the same seed sends the same bytes."""

    def __init__(self, clips: list[Clip], long_clip: Clip, max_upload_bytes: int, english_only: bool):
        self.clips = clips
        self.chat_clips = [c for c in clips if c.name.rsplit(".", 1)[-1].lower() in CHAT_FORMATS] or clips
        self.long_clip = long_clip
        self.max_upload_bytes = max_upload_bytes
        self.english_only = english_only
        self._base64: dict[str, str] = {}
        self._oversize: bytes | None = None

    def expect(self, kind: str) -> str:
        if kind == "translate":
            return CLIENT_ERROR if self.english_only else OK
        return EXPECT[kind]

    def upload(self, kind: str, clip: Clip, **fields: str) -> Spec:
        path = "/v1/audio/translations" if kind == "translate" else "/v1/audio/transcriptions"
        kwargs = {"files": {"file": (clip.name, clip.data)}, "data": {"model": "whisper-1", **fields}}
        check = CHECKS.get(kind, CHECKS["json"])
        return Spec(kind, self.expect(kind), path, kwargs, seconds=clip.seconds, check=check)

    def build(self, kind: str, seed: int) -> Spec:
        rng = random.Random(seed)
        clip = rng.choice(self.clips)
        if kind in ("json", "text", "srt", "vtt", "verbose_json"):
            return self.upload(kind, clip, response_format=kind)
        if kind == "words":
            return self.upload(kind, clip, response_format="verbose_json", **{"timestamp_granularities[]": "word"})
        if kind == "stream":
            spec = self.upload(kind, clip, stream="true", response_format=rng.choice(["json", "text"]))
            spec.stream = True
            return spec
        if kind == "translate":
            return self.upload(kind, clip, response_format="json")
        if kind == "chat":
            clip = rng.choice(self.chat_clips)
            if clip.name not in self._base64:
                self._base64[clip.name] = base64.b64encode(clip.data).decode()
            fmt = clip.name.rsplit(".", 1)[-1].lower()
            part = {"type": "input_audio", "input_audio": {"format": fmt if fmt in CHAT_FORMATS else "wav",
                                                           "data": self._base64[clip.name]}}
            body = {"model": "whisper-1", "messages": [{"role": "user", "content": [part]}]}
            return Spec(kind, OK, "/v1/chat/completions", {"json": body}, seconds=clip.seconds, check=chat_check)
        if kind == "random_bytes":
            name = "noise." + rng.choice(sorted(AUDIO_EXTS))
            return self.upload(kind, Clip(name, rng.randbytes(rng.randint(1024, 64 * 1024)), 0.0))
        if kind == "empty_file":
            return self.upload(kind, Clip("empty." + rng.choice(sorted(AUDIO_EXTS)), b"", 0.0))
        if kind == "truncated":
            # decoders may recover the head of a cut file (2xx) or refuse it (4xx); both are right
            cut = clip.data[: max(1, int(len(clip.data) * rng.uniform(0.02, 0.6)))]
            return self.upload(kind, Clip(clip.name, cut, 0.0))
        if kind == "unknown_model":
            spec = self.upload(kind, clip)
            spec.kwargs["data"]["model"] = rng.choice(["gpt-4o-transcribe", "whisper-2", "no/such-model"])
            return spec
        if kind == "bad_format":
            return self.upload(kind, clip, response_format=rng.choice(["xml", "markdown", "JSON", "srt2"]))
        if kind == "bad_temperature":
            return self.upload(kind, clip, temperature=rng.choice(["2.5", "-0.5", "1.01", "hot"]))
        if kind == "not_multipart":
            fields = {"model": "whisper-1", "file": base64.b64encode(clip.data[:4096]).decode()}
            kwargs = rng.choice([
                {"json": fields},
                {"data": fields},  # urlencoded: a form, but `file` is no file part
                {"content": clip.data[:4096], "headers": {"content-type": "application/octet-stream"}},
                {"content": b"--x\r\n", "headers": {"content-type": "multipart/form-data"}},  # no boundary
            ])
            return Spec(kind, CLIENT_ERROR, "/v1/audio/transcriptions", kwargs)
        if kind == "bad_json":
            text = rng.choice(['{"model": "whisper-1", "messages": [', "{model: whisper-1}", "not json", "\xff\xfe"])
            return Spec(kind, CLIENT_ERROR, "/v1/chat/completions",
                        {"content": text.encode("latin-1"), "headers": {"content-type": "application/json"}})
        if kind == "oversize":
            if self._oversize is None:  # zeros: the size is refused before any decoding
                self._oversize = bytes(self.max_upload_bytes + 64 * 1024)
            return self.upload(kind, Clip("big.wav", self._oversize, 0.0))
        if kind == "disconnect":
            return self.upload(kind, self.long_clip, response_format="json")
        raise ValueError(kind)


def plan(mix: dict[str, float], num_requests: int, seed: int) -> list[tuple[str, int]]:
    """(kind, seed of its request) for each request: every weighted kind once (as far as num_requests goes),
    the rest drawn by weight, shuffled."""
    rng = random.Random(seed)
    kinds = [k for k, w in mix.items() if w > 0]
    chosen = kinds[:num_requests]
    chosen += rng.choices(kinds, weights=[mix[k] for k in kinds], k=num_requests - len(chosen))
    rng.shuffle(chosen)
    return [(kind, rng.getrandbits(64)) for kind in chosen]


# ---------------------------------------------------------------- sending


STATUS_CLASSES = {OK: {2}, CLIENT_ERROR: {4}, OK_OR_CLIENT_ERROR: {2, 4}, CLIENT_ERROR_OR_CLOSED: {4}, HANG_UP: {2}}


def judge(spec: Spec, status: int, body_ok: bool, body: str, latency: float) -> Outcome:
    """An answer with a status; `body` (the start of it, or the last stream event) is kept for surprises."""
    if status // 100 == 2 and not body_ok:
        return Outcome(spec.kind, f"{status} bad body", "unexpected", False, latency, detail=body[:200])
    if status // 100 in STATUS_CLASSES[spec.expect]:
        if status // 100 == 2:
            return Outcome(spec.kind, str(status), "ok", False, latency, spec.seconds)
        return Outcome(spec.kind, str(status), "expected", False, latency)
    return Outcome(spec.kind, str(status), "unexpected", status >= 500, latency, detail=body[:200])


async def read_stream(response: httpx.Response) -> tuple[bool, str]:
    """Reads SSE `data:` lines up to transcript.text.done; (found it, last event for the record)."""
    last = ""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        last = line[5:].strip()
        try:
            event = json.loads(last)
        except ValueError:
            return False, last
        if "error" in event:
            return False, last
        if event.get("type") == "transcript.text.done":
            return isinstance(event.get("text"), str), last
    return False, last or "stream ended without transcript.text.done"


async def send(client: httpx.AsyncClient, url: str, spec: Spec, timeout_s: float) -> Outcome:
    start = time.perf_counter()
    kwargs = dict(spec.kwargs)
    if spec.expect == HANG_UP:
        # the read timeout is the hang-up: httpx closes the connection when it fires
        kwargs["timeout"] = httpx.Timeout(timeout_s, read=DISCONNECT_AFTER_S)

    async def exchange() -> Outcome:
        if spec.stream:
            async with client.stream("POST", url + spec.path, **kwargs) as response:
                if response.status_code == 200:
                    done, last = await read_stream(response)
                    return judge(spec, response.status_code, done, last, time.perf_counter() - start)
                await response.aread()
        else:
            response = await client.post(url + spec.path, **kwargs)
        body_ok = spec.check(response) if spec.check and response.status_code // 100 == 2 else True
        return judge(spec, response.status_code, body_ok, response.text[:200], time.perf_counter() - start)

    try:
        return await asyncio.wait_for(exchange(), timeout_s)  # the whole exchange, not each read
    except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
        if spec.expect == HANG_UP and isinstance(exc, httpx.ReadTimeout):
            return Outcome(spec.kind, "abandoned", "ok", False, time.perf_counter() - start)
        return Outcome(spec.kind, "timeout", "transport", True, time.perf_counter() - start, detail=repr(exc))
    except httpx.TransportError as exc:
        name = type(exc).__name__
        if spec.expect == CLIENT_ERROR_OR_CLOSED and isinstance(exc, (httpx.WriteError, httpx.RemoteProtocolError,
                                                                      httpx.ReadError)):
            return Outcome(spec.kind, f"closed ({name})", "expected", False, time.perf_counter() - start)
        return Outcome(spec.kind, name, "transport", True, time.perf_counter() - start, detail=str(exc)[:200])
    except Exception as exc:  # noqa: BLE001  a bug of this script must not end an hour-long soak; it counts as lost
        return Outcome(spec.kind, f"client {type(exc).__name__}", "transport", True, time.perf_counter() - start,
                       detail=repr(exc)[:200])


async def run_plan(url: str, headers: dict[str, str], planner: Planner, warmup: Spec,
                   requests: list[tuple[str, int]], concurrency: int, timeout_s: float, max_duration_s: float,
                   progress: list[int], warm_mark: list[float | None], t0: float) -> tuple[list[Outcome], float]:
    """The warm-up request, then `requests` with at most `concurrency` in flight; `progress` and `warm_mark`
    (when the first tenth was done, seconds after t0) are for the watcher threads."""
    # Connections idle past uvicorn's 5 s keep-alive are closed by the server; reusing one then would be a
    # transport error of the client's making.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
    outcomes: list[Outcome] = []
    next_index = 0
    warm_after = max(1, len(requests) // 10)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as client:
        warm = await send(client, url, warmup, timeout_s)
        if warm.verdict != "ok":
            raise SystemExit(f"warm-up transcription failed: {warm.label} {warm.detail}")
        start = time.perf_counter()
        deadline = time.monotonic() + max_duration_s

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(requests) and time.monotonic() < deadline:
                kind, seed = requests[next_index]
                next_index += 1
                outcomes.append(await send(client, url, planner.build(kind, seed), timeout_s))
                progress[0] = len(outcomes)
                if len(outcomes) == warm_after and warm_mark[0] is None:
                    warm_mark[0] = time.monotonic() - t0

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        wall_s = time.perf_counter() - start
    return outcomes, wall_s


# ---------------------------------------------------------------- watching the server


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0  # gone, or a kernel thread


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def listening_pid(port: int) -> int | None:
    """The process holding the listening TCP socket on `port` (only processes this user may inspect)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    for entry in os.listdir("/proc") if inodes else ():
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                return int(entry)
        except OSError:
            continue
    return None


def sample_rss(pid: int, t0: float, progress: list[int], samples: Samples) -> None:
    kids = descendants(pid)
    samples.rss.append((time.monotonic() - t0, progress[0], rss_kb(pid) / 1024, sum(map(rss_kb, kids)) / 1024,
                        len(kids)))


def watch(url: str, headers: dict[str, str], pid: int | None, rss_interval_s: float, max_s: float, t0: float,
          progress: list[int], samples: Samples, stop: threading.Event) -> list[threading.Thread]:
    """Threads that sample RSS and poll /health until `stop` is set (or `max_s` has passed)."""

    def rss_loop() -> None:
        for _ in range(int(max_s / rss_interval_s) + 1):
            sample_rss(pid, t0, progress, samples)
            if stop.wait(rss_interval_s):
                return

    def health_loop() -> None:
        with httpx.Client(timeout=10.0, headers=headers) as client:
            for _ in range(int(max_s / HEALTH_INTERVAL_S) + 1):
                start = time.perf_counter()
                try:
                    response = client.get(f"{url}/health")
                    if response.status_code == 200:
                        samples.health.append(time.perf_counter() - start)
                    else:
                        samples.health_bad[str(response.status_code)] += 1
                except httpx.HTTPError as exc:
                    samples.health_bad[type(exc).__name__] += 1
                if stop.wait(HEALTH_INTERVAL_S):
                    return

    threads = [threading.Thread(target=health_loop, daemon=True)]
    if pid is not None:
        threads.append(threading.Thread(target=rss_loop, daemon=True))
    for thread in threads:
        thread.start()
    return threads


def drain(url: str, headers: dict[str, str]) -> str:
    """Waits for /metrics to show nothing running or queued; says how it ended."""
    start = time.monotonic()
    values: dict[str, float] = {}
    while time.monotonic() - start < DRAIN_TIMEOUT_S:
        try:
            response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
            text = response.text if response.status_code == 200 else ""
        except httpx.HTTPError as exc:
            return f"/metrics failed: {type(exc).__name__}"
        values = {name: float(m.group(1)) for name in ("whisper_running_sequences", "whisper_queue_depth")
                  if (m := re.search(rf"^{name} (\S+)$", text, re.MULTILINE))}
        if not values:
            return f"/metrics ({response.status_code}) has no running/queue gauges"
        if not any(values.values()):
            return f"idle {time.monotonic() - start:.1f} s after the run (running 0, queued 0)"
        time.sleep(0.5)
    return f"NOT idle {DRAIN_TIMEOUT_S:.0f} s after the run: " + ", ".join(f"{k} {v:g}" for k, v in values.items())


# ---------------------------------------------------------------- report


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")


def pct(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.2f}" if values else "-"


def report_results(planner: Planner, requests: list[tuple[str, int]], outcomes: list[Outcome],
                   wall_s: float) -> None:
    planned = Counter(kind for kind, _ in requests)
    rows = []
    for kind in sorted(planned, key=list(DEFAULT_MIX).index):
        mine = [o for o in outcomes if o.kind == kind]
        verdicts = Counter(o.verdict for o in mine)
        labels = Counter(o.label for o in mine)
        ok_latency = [o.latency for o in mine if o.verdict == "ok"]
        rows.append((kind, planner.expect(kind), str(len(mine)), str(verdicts["ok"]), str(verdicts["expected"]),
                     str(verdicts["unexpected"]), str(verdicts["transport"]), str(sum(o.lost for o in mine)),
                     " ".join(f"{k}x{v}" for k, v in sorted(labels.items())),
                     pct(ok_latency, 50), pct(ok_latency, 95)))
    verdicts = Counter(o.verdict for o in outcomes)
    rows.append(("total", "", str(len(outcomes)), str(verdicts["ok"]), str(verdicts["expected"]),
                 str(verdicts["unexpected"]), str(verdicts["transport"]), str(sum(o.lost for o in outcomes)), "",
                 "", ""))
    table(("kind", "expect", "sent", "ok", "exp err", "unexpected", "transport", "lost", "statuses", "p50 s",
           "p95 s"), rows)
    if len(outcomes) < len(requests):
        print(f"NOT SENT: {len(requests) - len(outcomes)} requests (--max-duration-s reached)")

    good = [o for o in outcomes if o.kind in AUDIO_KINDS and o.verdict == "ok"]
    latency = [o.latency for o in good]
    audio_s = sum(o.seconds for o in good)
    print(f"\nsuccessful audio requests: {len(good)}, latency p50 {pct(latency, 50)} s, p95 {pct(latency, 95)} s, "
          f"p99 {pct(latency, 99)} s, max {max(latency, default=0):.2f} s")
    print(f"throughput: {len(outcomes) / wall_s:.2f} req/s all kinds, {len(good) / wall_s:.2f} req/s successful "
          f"audio, {audio_s:.0f} s of audio in {wall_s:.1f} s (RTFx {audio_s / wall_s:.2f})")

    examples = {(o.kind, o.label): o for o in reversed(outcomes) if o.verdict in ("unexpected", "transport")}
    for (kind, label), o in sorted(examples.items(), key=lambda item: list(DEFAULT_MIX).index(item[0][0])):
        print(f"example {kind} -> {label}: {o.detail[:200]!r}")


def report_rss(samples: Samples, warm_at: float | None) -> None:
    rss = samples.rss
    if not rss:
        print("\nRSS: not sampled (no server pid: pass --server-pid)")
        return
    base = next((i for i, s in enumerate(rss) if warm_at is not None and s[0] >= warm_at), None)
    keep = set(np.linspace(0, len(rss) - 1, min(len(rss), MAX_SERIES_ROWS)).round().astype(int).tolist())
    keep |= {base} if base is not None else set()
    rows = [(f"{t:.1f}", str(done), f"{srv:.0f}", f"{kids:.0f} ({n})", f"{srv + kids:.0f}" + (" <- warm" * (i == base)))
            for i, (t, done, srv, kids, n) in enumerate(rss) if i in keep]
    print(f"\nRSS of the server and its descendants ({len(rss)} samples; shown {len(rows)}):")
    table(("t s", "done", "server MB", "children MB (n)", "total MB"), rows)
    if base is None or rss[-1][0] - rss[base][0] < 1.0:
        print("growth after warm-up: n/a (too few samples after warm-up; run longer)")
        return
    # Allocators and caches keep growing while new batch shapes turn up; the second half says whether it stops.
    half = next(i for i, s in enumerate(rss) if s[0] >= (rss[base][0] + rss[-1][0]) / 2)
    for label, first in (("after warm-up", base), ("second half", half)):
        minutes = (rss[-1][0] - rss[first][0]) / 60
        if minutes <= 0:
            continue
        growth = [(rss[-1][k] - rss[first][k]) / minutes for k in (2, 3)]
        print(f"growth {label} ({minutes * 60:.0f} s): server {growth[0]:+.1f} MB/min, children "
              f"{growth[1]:+.1f} MB/min, total {sum(growth):+.1f} MB/min")
    print(f"peak total {max(s[2] + s[3] for s in rss):.0f} MB")


def report_health(samples: Samples) -> None:
    bad = ", ".join(f"{k}x{v}" for k, v in samples.health_bad.items()) or "none"
    lat = [x * 1000 for x in samples.health]
    print(f"\n/health: {len(lat)} x 200, p50 {np.percentile(lat, 50):.1f} ms, max {max(lat):.1f} ms; not 200: {bad}"
          if lat else f"\n/health: no 200 answers; not 200: {bad}")


def server_errors(spawned: RemoteServer, limit: int = 10) -> list[str]:
    lines = [ln for ln in spawned.log_tail(200_000).splitlines() if "unhandled error" in ln or ln.startswith("ERROR")]
    return list(dict.fromkeys(lines))[:limit]


# ---------------------------------------------------------------- main


def parse_mix(text: str) -> dict[str, float]:
    mix = dict(DEFAULT_MIX)
    for item in filter(None, text.split(",")):
        name, _, weight = item.partition("=")
        if name not in mix:
            raise argparse.ArgumentTypeError(f"unknown kind {name!r}; kinds: {', '.join(DEFAULT_MIX)}")
        try:
            mix[name] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--mix wants kind=weight, got {item!r}") from None
    if not any(w > 0 for w in mix.values()):
        raise argparse.ArgumentTypeError("--mix leaves no kind with a weight above 0")
    return mix


def spawn_flag(spawn_args: str | None, name: str) -> str | None:
    """The value of `name` among the --spawn flags (the first, where the server takes several)."""
    words = shlex.split(spawn_args or "")
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def served_model(url: str, headers: dict[str, str]) -> str:
    try:
        return str(httpx.get(f"{url}/health", headers=headers, timeout=10).json().get("model", ""))
    except (httpx.HTTPError, ValueError, AttributeError):
        return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (ignored with --spawn)")
    ap.add_argument("--spawn", nargs="?", const="", default=None, metavar="ARGS",
                    help='start `python -m server serve ARGS` on a free local port for the run ("" = defaults)')
    ap.add_argument("--requests", type=int, default=2000, help="requests in the timed run")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight at once")
    ap.add_argument("--seed", type=int, default=0, help="seed of the request plan")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="a request with no answer by then is lost")
    ap.add_argument("--max-duration-s", type=float, default=3600.0, help="stop sending new requests after this")
    ap.add_argument("--data-dir", type=Path, default=DATA, help="the clips (default: tests/data)")
    ap.add_argument("--mix", type=parse_mix, default=dict(DEFAULT_MIX),
                    help="kind=weight,... overriding the default weights (0 leaves a kind out)")
    ap.add_argument("--max-upload-mb", type=float, default=None,
                    help="the server's upload limit, for the oversize kind (default: from --spawn, else 25)")
    ap.add_argument("--api-key", default=None,
                    help="bearer token sent with every request (default: from --spawn, else $OPENAI_API_KEY)")
    ap.add_argument("--server-pid", type=int, default=None, help="pid whose RSS to sample (default: found)")
    ap.add_argument("--rss-interval-s", type=float, default=2.0, help="seconds between RSS samples")
    args = ap.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        ap.error("--requests and --concurrency must be >= 1")
    if args.timeout_s <= 0 or args.max_duration_s <= 0 or args.rss_interval_s <= 0:
        ap.error("--timeout-s, --max-duration-s and --rss-interval-s must be > 0")

    if args.spawn is None and urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        ap.error("--url must be a loopback address")  # a soak is a load test: never aimed at someone else's host

    upload_mb = args.max_upload_mb or float(spawn_flag(args.spawn, "--max-upload-mb") or DEFAULT_MAX_UPLOAD_MB)
    max_upload_bytes = int(upload_mb * MIB)
    clips, long_clip, left_out = load_clips(args.data_dir.resolve(), max_upload_bytes)
    api_key = args.api_key or spawn_flag(args.spawn, "--api-key") or os.environ.get("OPENAI_API_KEY") or "unused"
    headers = {"Authorization": f"Bearer {api_key}"}  # what the SDK sends; ignored by a server without keys
    spawned = spawn_or_exit(args.spawn) if args.spawn is not None else None
    url = spawned.url if spawned else args.url.rstrip("/")
    try:
        model = served_model(url, headers)
        english_only = model.rstrip("/").endswith(".en")
        planner = Planner(clips, long_clip, max_upload_bytes, english_only)
        warmup = planner.upload("json", min(clips, key=lambda c: c.seconds), response_format="json")
        requests = plan(args.mix, args.requests, args.seed)

        pid = args.server_pid or (spawned.proc.pid if spawned else listening_pid(urlsplit(url).port or 80))
        print(f"soak: {url} (model {model or '?'}{', English-only' if english_only else ''}, pid {pid or '?'}), "
              f"{len(requests)} requests at concurrency {args.concurrency}, seed {args.seed}, {len(clips)} clips "
              f"({left_out} over the upload limit left out), "
              f"hang-up clip {long_clip.name}, upload limit {max_upload_bytes / MIB:g} MiB", flush=True)
        samples, stop = Samples(), threading.Event()
        progress, warm_mark, t0 = [0], [None], time.monotonic()
        watch_s = args.max_duration_s + args.timeout_s + 120  # the longest the run can last
        threads = watch(url, headers, pid, args.rss_interval_s, watch_s, t0, progress, samples, stop)
        try:
            outcomes, wall_s = asyncio.run(run_plan(url, headers, planner, warmup, requests, args.concurrency,
                                                    args.timeout_s, args.max_duration_s, progress, warm_mark, t0))
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=15)
        idle = drain(url, headers)
        if pid is not None:
            sample_rss(pid, t0, progress, samples)  # the end point of the growth figure
        errors = server_errors(spawned) if spawned and any(o.lost and o.label[0] == "5" for o in outcomes) else []
    finally:
        if spawned:
            spawned.stop()

    print(f"\n{url}, model {model or '?'}, {len(outcomes)} requests at concurrency {args.concurrency}, "
          f"seed {args.seed}, wall {wall_s:.1f} s")
    report_results(planner, requests, outcomes, wall_s)
    report_rss(samples, warm_mark[0])
    report_health(samples)
    print(f"engine after the run: {idle}")
    for line in errors:
        print(f"server log: {line[:240]}")
    lost = sum(o.lost for o in outcomes)
    five = Counter(o.kind for o in outcomes if o.lost and o.label[0] == "5")
    print(f"\n{'FAIL' if lost else 'PASS'}: {lost} lost" + (f" (5xx by kind: {dict(five)})" if five else ""))
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
