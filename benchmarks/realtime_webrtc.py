"""Realtime sessions over WebRTC against WebSocket sessions, the same speech at the same pace, in one run.

    python benchmarks/realtime_webrtc.py --spawn "--model tiny.en" --sessions 1 4 16

For each session count, N sessions over each transport (WebSocket rows and WebRTC rows alternate; the sessions of
a row start within one 100 ms chunk): each streams 0.5 s of silence, a LibriSpeech clip from tests/data and 1.5 s
of silence at real-time pace, under server VAD with OpenAI's defaults. A WebSocket session sends 24 kHz PCM in
100 ms `input_audio_buffer.append` events; a WebRTC call (an aiortc peer, as a phone or a browser is) speaks the
same clip at 48 kHz on an Opus track in 20 ms frames and reads the events on `oai-events`. Per session:
- set-up: from the start of the connection (the WebSocket's handshake; the call's offer, POST /v1/realtime/calls,
  ICE, DTLS and the data channel) to `session.created`;
- first delta: from the voice's onset (where `speech_started` puts it, plus the prefix padding it subtracted, at
  the moment the stream reached it) to the first live delta;
- after speech: from the clip's last sample leaving the client to the completed transcript (includes the 500 ms
  the VAD waits);
- speech_stopped lag: `speech_stopped` past the moment the VAD could end the turn (speech end + 500 ms);
- the transcripts' words against the same session's WebSocket transcript (Opus is lossy).
Prints p50 / p95 per transport and count, failed sessions, the server's peak resident memory while the row ran, and
the CPU time the server and this client (the peers' Opus encoding and packets share the machine) used in the row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.realtime_sessions import PREFIX_MS, SILENCE_MS, PeakMemory, pct
from tests.helpers.realtime import CHUNK_MS, chunks, pcm_at
from tests.helpers.server import spawn_or_exit
from tests.helpers.transcripts import normalize_text
from tests.helpers.webrtc import RATE, ClipTrack, WebRTCClient

CLIP = ROOT / "tests" / "data" / "g1_en_librispeech-test-clean_1221-135766-0002.wav"
LEAD_S, TAIL_S = 0.5, 1.5
COMPLETED = "conversation.item.input_audio_transcription.completed"


class Turn:
    """What one session saw, in perf_counter seconds."""

    def __init__(self) -> None:
        self.begin = time.perf_counter()
        self.created = self.stream_start = self.onset_ms = self.first_delta = None
        self.stopped = self.end_ms = self.completed = None
        self.transcript = ""

    def hear(self, event: dict) -> bool:
        """Record the event; True once the turn's transcript is in."""
        now, kind = time.perf_counter(), event["type"]
        if kind == "session.created":
            self.created = now
        elif kind == "input_audio_buffer.speech_started" and self.onset_ms is None:
            self.onset_ms = event["audio_start_ms"] + PREFIX_MS
        elif kind == "conversation.item.input_audio_transcription.delta" and self.first_delta is None:
            self.first_delta = now
        elif kind == "input_audio_buffer.speech_stopped" and self.stopped is None:
            self.stopped, self.end_ms = now, event["audio_end_ms"]
        elif kind == COMPLETED:
            self.completed, self.transcript = now, event["transcript"]
            return True
        elif kind == "error":
            raise RuntimeError(event["error"]["message"])
        return False

    def row(self, speech_s: float) -> tuple[float, float, float, float]:
        onset = self.stream_start + self.onset_ms / 1000
        speech_end = self.stream_start + LEAD_S + speech_s
        decidable = self.stream_start + (self.end_ms + SILENCE_MS) / 1000
        first = (self.first_delta or self.completed) - onset
        return self.created - self.begin, first, self.completed - speech_end, self.stopped - decidable


async def websocket_session(url: str, pcm24: np.ndarray, delay: float) -> Turn:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    stream = np.concatenate([np.zeros(int(LEAD_S * 24000), "<i2"), pcm24, np.zeros(int(TAIL_S * 24000), "<i2")])
    turn = Turn()
    async with connect(url.replace("http://", "ws://") + "/v1/realtime?intent=transcription", max_size=2**25) as ws:

        async def read() -> None:
            async for message in ws:
                if turn.hear(json.loads(message)):
                    return

        reader = asyncio.ensure_future(read())
        while turn.created is None:
            await asyncio.sleep(0.005)
        turn.stream_start = start = time.perf_counter()
        for i, piece in enumerate(chunks(stream.tobytes(), 48)):
            await asyncio.sleep(max(0.0, start + i * CHUNK_MS / 1000 - time.perf_counter()))
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        await asyncio.wait_for(reader, 120)
    return turn


async def webrtc_session(client, pcm48: np.ndarray, delay: float) -> Turn:
    await asyncio.sleep(delay)
    turn = Turn()
    track = ClipTrack(np.concatenate([pcm48, np.zeros(int(TAIL_S * RATE), "<i2")]), lead_s=LEAD_S)
    call = WebRTCClient(track)
    try:
        await call.start(client, session={"type": "transcription"})
        while not turn.hear(await call.next_event()):
            pass
        turn.stream_start = track.sent_at  # the track's first frame: the stream's time zero
    finally:
        await call.close()
    return turn


async def run_row(server, transport: str, n: int, pcm24: np.ndarray, pcm48: np.ndarray) -> tuple[list, int]:
    delays = [i * CHUNK_MS / 1000 / max(1, n) for i in range(n)]
    if transport == "websocket":
        jobs = [websocket_session(server.url, pcm24, d) for d in delays]
        outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    else:
        async with server.async_client() as client:
            jobs = [webrtc_session(client, pcm48, d) for d in delays]
            outcomes = await asyncio.gather(*jobs, return_exceptions=True)
    turns = [t for t in outcomes if isinstance(t, Turn)]
    for failure in (o for o in outcomes if not isinstance(o, Turn)):
        print(f"  failed: {failure!r}", file=sys.stderr)
    return turns, n - len(turns)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far (it runs the engine in-process unless told not to)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spawn", default="--model tiny.en", help="flags of the server this run starts")
    ap.add_argument("--sessions", nargs="+", type=int, default=[1, 4, 16])
    args = ap.parse_args()
    pcm24, pcm48 = pcm_at(CLIP, 24000), pcm_at(CLIP, RATE)
    speech_s = len(pcm48) / RATE
    server = spawn_or_exit(args.spawn + " --realtime-max-sessions 1000")
    try:
        print(f"clip: {CLIP.name} ({speech_s:.1f} s), server: {args.spawn}")
        print("| sessions | transport | set-up p50 | first delta p50 / p95 | after speech p50 / p95 | "
              "speech_stopped lag p95 | same words as WebSocket | failed | peak RSS MiB | server CPU s | client CPU s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for n in args.sessions:
            reference = None
            for transport in ("websocket", "webrtc"):
                server_cpu, client_cpu = cpu_seconds(server.proc.pid), time.process_time()
                with PeakMemory(server.proc.pid) as memory:
                    turns, failed = asyncio.run(run_row(server, transport, n, pcm24, pcm48))
                server_cpu = cpu_seconds(server.proc.pid) - server_cpu
                client_cpu = time.process_time() - client_cpu
                if not turns:
                    print(f"| {n} | {transport} | all {failed} failed |")
                    continue
                rows = [t.row(speech_s) for t in turns]
                setup, first, after, lag = (list(c) for c in zip(*rows))
                texts = [normalize_text(t.transcript) for t in turns]
                reference = reference or texts[0]
                same = sum(t == reference for t in texts)
                print(f"| {n} | {transport} | {statistics.median(setup):.3f} | {statistics.median(first):.2f} / "
                      f"{pct(first, 95):.2f} | {statistics.median(after):.2f} / {pct(after, 95):.2f} | "
                      f"{pct(lag, 95):.3f} | {same} of {len(texts)} | {failed} | {memory.rss:.0f} | {server_cpu:.1f} | "
                      f"{client_cpu:.1f} |")  # fmt: skip
                time.sleep(1.0)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
