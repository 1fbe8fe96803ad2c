"""A session's input audio buffer: its uncommitted audio at 16 kHz, and the item that audio is to be committed as.

The buffer is a window on one stream: `offset` is the stream position of its first sample, so that server VAD can
drop the audio no turn will need while positions (frames, milliseconds) stay those of the whole stream.

Buffered audio is bounded per session (`realtime_max_buffer_s`) and across them (`realtime_max_buffered_seconds_
total`); an append is measured against both from its base64 length, before anything is decoded, and a large one
is decoded in a worker thread, one at a time server-wide.
"""

from __future__ import annotations

import asyncio

import numpy as np

from engine import SAMPLE_RATE

from ..settings import MAX_APPEND_BASE64, Settings
from .audio_input import AudioFormatError, InputAudio, base64_size
from .load import SharedLoad


class ServerBufferFull(Exception):
    """The sessions together hold realtime_max_buffered_seconds_total of audio: an append past it is refused."""


class InputBuffer:
    """The session's `input_audio_buffer`: appends decoded by `audio` (the session's format), the samples kept
    until a turn is committed, counted in the server-wide total as long as they are held."""

    def __init__(self, format_type: str, settings: Settings, load: SharedLoad) -> None:
        self.audio = InputAudio(format_type)  # replaced when session.update changes the format
        self.settings = settings
        self.load = load
        self._num_samples = 0
        self.reserved = 0  # samples of appends read and not yet decoded (reserve()), counted in both totals
        self.reset()

    @property
    def num_samples(self) -> int:
        """Samples in the buffer, counted in the server-wide total as well."""
        return self._num_samples

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self.load.buffered_samples += value - self._num_samples
        self._num_samples = value

    @property
    def end(self) -> int:
        """The stream position just past the buffer's last sample."""
        return self.offset + self.num_samples

    def reset(self) -> None:
        self.samples: list[np.ndarray] = []  # the uncommitted audio, 16 kHz
        self.num_samples = 0
        self.offset = 0  # stream position (samples) of samples[0]
        self.item_id: str | None = None  # the item the open turn is committed as, once it has one

    def reserve(self, data: str) -> int:
        """Room for what an append's base64 `data` adds once decoded, refused before anything is decoded if it would
        not fit the session's buffer or the server's (AudioFormatError, ServerBufferFull): the samples reserved,
        counted in both totals until release()."""
        if len(data) > MAX_APPEND_BASE64:
            raise AudioFormatError(f"an append carries at most {MAX_APPEND_BASE64} base64 characters")
        needed = int(self.audio.seconds(base64_size(data)) * SAMPLE_RATE)
        self.admit(needed)
        self.reserved += needed
        self.load.buffered_samples += needed
        return needed

    def release(self, num_samples: int) -> None:
        """Reserved samples decoded (then added), or given up."""
        self.reserved -= num_samples
        self.load.buffered_samples -= num_samples

    async def decode_large(self, data: str) -> np.ndarray:
        """The 16 kHz samples of a large append (reserved), decoded in a worker thread, one such append at a time
        server-wide; not added: add() does that."""
        needed = self.reserve(data)
        try:
            async with self.load.decoding:
                return await asyncio.to_thread(self.audio.append_base64, data)
        finally:
            self.release(needed)

    def admit(self, num_samples: int) -> None:
        """Raise unless `num_samples` more fit the session's buffer and the server's (AudioFormatError,
        ServerBufferFull)."""
        settings = self.settings
        if self.num_samples + self.reserved + num_samples > settings.realtime_max_buffer_s * SAMPLE_RATE:
            raise AudioFormatError(
                f"the input audio buffer holds at most {settings.realtime_max_buffer_s:g} s; commit or clear it"
            )
        if self.load.buffered_samples + num_samples > settings.realtime_max_buffered_seconds_total * SAMPLE_RATE:
            raise ServerBufferFull(
                f"the server holds at most {settings.realtime_max_buffered_seconds_total:g} s of uncommitted audio "
                "across its sessions; commit, or send it again later"
            )

    def add(self, samples: np.ndarray) -> None:
        self.samples.append(samples)
        self.num_samples += len(samples)

    def buffered(self, start: int, end: int) -> np.ndarray:
        """Stream samples [start, end) still in the buffer."""
        audio = np.concatenate(self.samples) if self.samples else np.zeros(0, dtype=np.float32)
        return audio[max(0, start - self.offset) : max(0, end - self.offset)]

    def drop_before(self, position: int) -> None:
        """Forget the samples before stream position `position` (the server VAD, after each pass of a silent
        stream): whole chunks go, the first one kept is sliced, nothing is copied."""
        drop = position - self.offset
        if drop <= 0:
            return
        chunks = self.samples
        i = 0
        while i < len(chunks) and drop >= len(chunks[i]):
            drop -= len(chunks[i])
            i += 1
        kept = chunks[i:]
        if kept and drop:
            kept[0] = kept[0][drop:]
        self.samples = kept
        self.num_samples = sum(len(c) for c in kept)
        self.offset = position
