"""A realtime session over WebRTC (OpenAI's GA transport for browsers and phones), on aiortc.

The client posts its SDP offer to /v1/realtime/calls (routes/realtime.py) and gets this server's answer; then its
microphone arrives on the offer's audio track (Opus) and the protocol's events flow both ways on the data channel
it created, `oai-events`. A Call is that peer connection as a transport.py Transport, so the session behind it is
the same Connection a WebSocket gets: the track's audio is heard as appends are, a tenth of a second at a time.

What bounds a call: its offer must bring one audio track and a data channel, and no video (frames nobody reads
would pile up); it must connect within `realtime_webrtc_connect_timeout_s`; its track may not run ahead of the
clock (a microphone cannot), nor an event on its channel be larger than a WebSocket's may; what it sends waits in
a queue of MAX_INBOX items, past which the server cannot keep up with it: each of these ends the call with an
error. Events to it wait while the channel holds SEND_BUFFER_BYTES unsent. ICE uses the configured STUN/TURN
servers only (`realtime_ice_servers`, none by default: host candidates, enough on one machine or a flat network).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..settings import MAX_APPEND_BASE64, WS_EVENT_ROOM, IceServer
from .audio_input import TrackAudio
from .events import error
from .load import SharedLoad
from .transport import Inbound

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"  # OpenAI's name for the data channel that carries the events
MAX_INBOX = 600  # client events and 100 ms chunks of audio received and not yet handled
TRACK_CHUNK_S = 0.04  # the track's audio is handed to the session in chunks of this many seconds: two 20 ms frames
SEND_BUFFER_BYTES = 1 << 20  # events sent and not yet on the wire, past which the session's sends wait
MAX_AHEAD_S = 5.0  # a microphone speaks in real time: a track this far ahead of the clock is flooding the server
MAX_EVENT_CHARS = MAX_APPEND_BASE64 + WS_EVENT_ROOM  # the largest event, as a WebSocket's frames are bounded


class OfferError(ValueError):
    """The SDP offer cannot make a transcription call: the message says why."""


def check_offer(sdp: str) -> None:
    """What a transcription call needs from an offer, before a peer connection is made for it."""
    media = [line.split()[0][2:] for line in sdp.splitlines() if line.startswith("m=") and line.split()]
    if not sdp.startswith("v=0") or not media:
        raise OfferError("the body is not an SDP offer (it starts with v=0 and has m= lines)")
    if "audio" not in media:
        raise OfferError("the offer has no audio track: add the microphone's track before creating the offer")
    if "application" not in media:
        raise OfferError(f"the offer has no data channel: create the '{EVENTS_CHANNEL}' channel before the offer")
    if "video" in media:
        raise OfferError("a transcription call takes audio only: the offer has a video track")


def ice_servers(servers: list[IceServer]) -> list[RTCIceServer]:
    """The settings' STUN/TURN servers (`realtime_ice_servers`) as aiortc takes them."""
    return [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in servers]


class Call:
    """One WebRTC call: a peer connection whose data channel and audio track feed one inbox."""

    def __init__(self, call_id: str, load: SharedLoad, servers: list[RTCIceServer], connect_timeout_s: float):
        self.id = call_id
        self.load = load
        self.connect_timeout_s = connect_timeout_s
        # no default STUN server: the operator says which ones (aiortc would otherwise ask Google's)
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        self.inbox: asyncio.Queue[Inbound] = asyncio.Queue()
        self.channel = None
        self.opened = asyncio.Event()  # the events channel is open, or the call is over
        self.drained = asyncio.Event()  # the channel's send buffer is below its threshold
        self.ended = False
        self.audio = TrackAudio()
        self.reader: asyncio.Task | None = None
        self.pc.on("datachannel", self._on_channel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    async def answer(self, offer: str) -> str:
        """This side's SDP answer to the client's offer (OfferError if aiortc cannot use it)."""
        check_offer(offer)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as exc:  # noqa: BLE001 - aiortc's parser raises what it meets; the client hears why in a line
            await self.pc.close()
            raise OfferError(f"the SDP offer could not be used: {exc}") from None
        asyncio.get_running_loop().call_later(self.connect_timeout_s, self._check_connected)
        return self.pc.localDescription.sdp

    # ---- Transport ----------------------------------------------------------------------------------------------

    async def receive(self) -> Inbound:
        return await self.inbox.get()

    async def send_text(self, text: str) -> None:
        await self.opened.wait()  # the session's first events are sent once the channel opens
        channel = self.channel
        while not self.ended and channel.bufferedAmount > SEND_BUFFER_BYTES:
            self.drained.clear()
            await self.drained.wait()
        if not self.ended and channel.readyState == "open":
            channel.send(text)

    async def close(self, code: int = 1000) -> None:
        self._end()
        await self.pc.close()

    # ---- the peer connection's events ---------------------------------------------------------------------------

    def _on_channel(self, channel) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            return  # only the events channel is read
        self.channel = channel
        channel.bufferedAmountLowThreshold = SEND_BUFFER_BYTES // 2
        channel.on("message", self._put)
        channel.on("bufferedamountlow", self.drained.set)
        channel.on("close", self._end)
        self.opened.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.reader is None:
            self.reader = asyncio.ensure_future(self._read_track(track))

    async def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._end()

    def _check_connected(self) -> None:
        if self.pc.connectionState != "connected" or self.channel is None:
            log.info("WebRTC call %s did not connect within %g s", self.id, self.connect_timeout_s)
            self._end()

    async def _read_track(self, track: MediaStreamTrack) -> None:
        """The track's frames, resampled a chunk at a time beside the event loop (every call's in one pass)."""
        frames: list[av.AudioFrame] = []
        duration = heard_s = 0.0
        started = None
        while not self.ended:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            started = started or time.monotonic()
            heard_s += frame.samples / frame.sample_rate
            if heard_s > time.monotonic() - started + MAX_AHEAD_S:
                self._fail("the call's audio arrives faster than real time", "invalid_audio")
                return
            frames.append(frame)
            duration += frame.samples / frame.sample_rate
            if duration >= TRACK_CHUNK_S:
                samples = await self.load.tracks.run((self.audio, frames))
                frames, duration = [], 0.0
                self._put(samples)

    def _put(self, item: str | bytes | np.ndarray) -> None:
        if self.ended:
            return
        if isinstance(item, (str, bytes)) and len(item) > MAX_EVENT_CHARS:
            self._fail(f"an event is at most {MAX_EVENT_CHARS} characters", "event_too_large")
        elif self.inbox.qsize() >= MAX_INBOX:
            log.warning("WebRTC call %s: %d items unhandled, the call ends", self.id, MAX_INBOX)
            self._fail("the server could not keep up with this call's audio and events", "server_overloaded",
                       "server_error")  # fmt: skip
        else:
            self.inbox.put_nowait(item)

    def _fail(self, message: str, code: str, type_: str = "invalid_request_error") -> None:
        """The call ends, with a last `error` on the channel if it can still take one."""
        with contextlib.suppress(Exception):
            self.channel.send(json.dumps(error(message, type_=type_, code=code)))
        self._end()

    def _end(self) -> None:
        """The call is over: the session reads None next, and nothing waits on the channel any more."""
        if self.ended:
            return
        self.ended = True
        self.inbox.put_nowait(None)
        self.opened.set()
        self.drained.set()
        if self.reader is not None:
            self.reader.cancel()
