"""A WebRTC realtime client (aiortc, the peer a phone or a browser would be): a clip streamed as a microphone on an
Opus track at real-time pace, the protocol's events on the `oai-events` data channel, the call set up through the
official SDK's `realtime.calls.create` (or a raw POST of the offer)."""

from __future__ import annotations

import asyncio
import fractions
import json
import time

import av
import numpy as np
import openai
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48000  # Opus's
FRAME_SAMPLES = 960  # 20 ms, as browsers send


class ClipTrack(MediaStreamTrack):
    """A microphone that says `pcm` (16-bit samples at 48 kHz) at real-time pace, then stays silent until stopped;
    `said` is set once the clip has been sent, `sent_at` is when its first frame went out."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray, lead_s: float = 0.0) -> None:
        super().__init__()
        lead = np.zeros(int(lead_s * RATE), dtype="<i2")
        self.pcm = np.concatenate([lead, pcm.astype("<i2")])
        self.position = 0
        self.start: float | None = None
        self.said = asyncio.Event()
        self.sent_at: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.start is None:
            self.start = time.perf_counter()
            self.sent_at = self.start
        else:
            await asyncio.sleep(max(0.0, self.start + self.position / RATE - time.perf_counter()))
        chunk = self.pcm[self.position : self.position + FRAME_SAMPLES]
        if len(chunk) < FRAME_SAMPLES:
            self.said.set()
            chunk = np.concatenate([chunk, np.zeros(FRAME_SAMPLES - len(chunk), dtype="<i2")])
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.position
        frame.time_base = fractions.Fraction(1, RATE)
        self.position += FRAME_SAMPLES
        return frame


class WebRTCClient:
    """One call: `await start(...)`, then `await next_event()` / `send(event)`, `await close()`."""

    def __init__(self, track: ClipTrack | None) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no STUN: both ends are on this machine
        self.track = track
        if track is not None:
            self.pc.addTrack(track)
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.opened = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.channel.on("message", lambda text: self.events.put_nowait(json.loads(text)))
        self.call_id: str | None = None

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def start(self, client: openai.AsyncOpenAI, session: dict | None = None) -> None:
        """The call through the SDK: the offer (and session) posted, the answer applied, the channel open."""
        kwargs = {"session": session} if session is not None else {}
        response = await client.realtime.calls.with_raw_response.create(sdp=await self.offer(), **kwargs)
        assert response.status_code == 201, response.text
        self.call_id = response.headers["location"].rsplit("/", 1)[1]
        await self.answer(response.text)

    async def answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        await asyncio.wait_for(self.opened.wait(), 30)

    def send(self, event: dict) -> None:
        self.channel.send(json.dumps(event))

    async def next_event(self, timeout_s: float = 120) -> dict:
        return await asyncio.wait_for(self.events.get(), timeout_s)

    async def until(self, kind: str, timeout_s: float = 120) -> tuple[dict, list[dict]]:
        """The next event of `kind`, and every event before it."""
        seen = []
        while True:
            event = await self.next_event(timeout_s)
            if event["type"] == kind:
                return event, seen
            seen.append(event)

    async def close(self) -> None:
        await self.pc.close()
