"""What carries a realtime session: the one interface connection.py reads and writes, whichever way the client came.

A WebSocket carries the client's events as text frames, its audio inside them (`input_audio_buffer.append`). A
WebRTC call (webrtc.py) carries the events on its `oai-events` data channel and the microphone on an Opus track,
whose audio arrives as samples. Either way the session is the same Connection: one implementation of the
protocol, two transports.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

# What receive() gives: a client event's JSON text, a binary message (not part of the protocol), 16 kHz float32
# samples of the session's media track, or None once the client has gone.
Inbound = str | bytes | np.ndarray | None


class Transport(Protocol):
    async def receive(self) -> Inbound: ...

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int = 1000) -> None: ...


class WebSocketTransport:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def receive(self) -> Inbound:
        message = await self.websocket.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def send_text(self, text: str) -> None:
        await self.websocket.send_text(text)

    async def close(self, code: int = 1000) -> None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client may have closed it first
            await self.websocket.close(code=code)
