"""Server VAD: where a session's turns start and end, from Silero's speech probabilities over its input stream.

Silero runs on the stream as it arrives (SpeechBatcher, with every other session's appends). A turn starts at the
first frame at or above `threshold` and ends once `silence_duration_ms` of frames have stayed below `threshold -
0.15` (Silero's hysteresis); its audio runs from `prefix_padding_ms` before the speech to `tail_ms` after it (the
server's realtime_turn_tail_ms, at most the silence): the rest of the silence is the wait for the end, not the
turn. Once the speech has been followed by that tail the turn's audio is known, and the detector says so
(TurnEnding) while it waits out the silence, so that the turn's transcript can be decoded meanwhile; speech that
resumes within the wait says SpeechResumed, and the turn goes on.
With `idle_timeout_ms`, a stream that long without speech is committed as a turn all the same (the model may hear
speech the VAD did not). Between turns the buffer keeps only what the next one may start with: the prefix
padding, or under `idle_timeout_ms` the quiet audio since the last turn.

Under semantic_vad the silence that ends a turn depends on the turn: once its speech has been followed by its tail
(the moment TurnEnding is said), the end-of-turn model hears the turn's audio and says how likely it is complete.
At or above the eagerness's probability the turn ends after `silence_duration_ms` (its short wait), below it after
the eagerness's maximum wait; speech that resumes first goes on with the turn, and its next pause is asked again.
The answer must be known at that very frame, whatever the size of the append it arrived in, and the model runs in a
worker thread: so hear(), which is awaited, runs detect() dry over the frames it has just heard (on a copy of the
state and a preview of the buffer), answers each question the dry run meets, and keeps the answers for the real
run. The two runs read the same frames from the same state: one state machine, and the real one never waits.

The detector says what it finds as it goes (detect() is a generator): the connection turns each finding into the
protocol's events and commits each turn before the detector reads the next frame, so events and buffer stay in
step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine import SAMPLE_RATE

from .buffers import InputBuffer
from .events import new_id
from .session import SessionConfig, TurnDetection
from .speech_batcher import SpeechBatcher

FRAME_MS = 32  # Silero's frame at 16 kHz
NEG_THRESHOLD_GAP = 0.15  # silero's hysteresis: speech ends below threshold - 0.15


@dataclass(frozen=True)
class SpeechStarted:
    item_id: str
    audio_start_ms: int  # where the turn's audio begins: its first speech frame less the prefix padding
    voice_at: int  # the stream position of its first speech frame


@dataclass(frozen=True)
class SpeechStopped:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, eq=False)
class TurnEnding:
    """The open turn's speech has been followed by its tail of silence: `audio` is the turn's, if it ends."""

    item_id: str
    audio: np.ndarray


@dataclass(frozen=True)
class SpeechResumed:
    """Speech came back after a TurnEnding, before the silence ended the turn: that audio is not the turn's."""

    item_id: str


@dataclass(frozen=True)
class IdleTimeout:
    """`idle_timeout_ms` without speech: OpenAI's `timeout_triggered`; a Turn of the quiet audio follows."""

    item_id: str
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True, eq=False)
class Turn:
    """A turn to commit: its item and its audio."""

    item_id: str
    audio: np.ndarray


Detection = SpeechStarted | SpeechStopped | TurnEnding | SpeechResumed | IdleTimeout | Turn


@dataclass(frozen=True, eq=False)
class EndOfTurnQuestion:
    """semantic_vad, in hear()'s dry run only: is the turn complete if it ends in the silence that began at
    `silent_frame`? `audio` is the turn's audio if it does."""

    silent_frame: int
    audio: np.ndarray


class BufferPreview:
    """The input buffer as detect() would leave it, for hear()'s dry run: the same audio, with the dry run's drops
    and item ids kept to itself."""

    def __init__(self, buffer: InputBuffer) -> None:
        self.buffer = buffer
        self.offset = buffer.offset
        self.item_id = buffer.item_id

    def buffered(self, start: int, end: int) -> np.ndarray:
        return self.buffer.buffered(max(start, self.offset), end)

    def drop_before(self, position: int) -> None:
        self.offset = max(self.offset, position)


class TurnDetector:
    """One session's server VAD state: its Silero stream, the speech in progress, and where the stream has been
    without speech since. It cuts the turns out of `buffer` and gives the open turn its item id. `session` says,
    when hear() is called, whether the session is under semantic_vad."""

    def __init__(
        self, batcher: SpeechBatcher, buffer: InputBuffer, tail_ms: int, session: SessionConfig | None = None
    ) -> None:
        self.batcher = batcher
        self.speech = batcher.stream()  # this session's stream, pushed in one pass with the other sessions'
        self.buffer = buffer
        self.tail_ms = tail_ms
        self.session = session
        self.complete: dict[int, bool] = {}  # semantic_vad: a silence's first frame -> whether its turn is complete
        self.speech_start: int | None = None  # frame index where the current speech began
        self.silent_since: int | None = None
        self.ending = False  # TurnEnding said for the silence in progress
        self.idle_from = 0  # where the stream has been without speech since (idle_timeout_ms)

    @property
    def idle_from_ms(self) -> int:
        return self.idle_from * 1000 // SAMPLE_RATE

    def turn_start(self, td: TurnDetection) -> int | None:
        """The stream position where the open turn's audio begins (its speech, less the prefix padding); None
        while no speech has started."""
        if self.speech_start is None:
            return None
        return max(0, self.speech_start * FRAME_MS - td.prefix_padding_ms) * SAMPLE_RATE // 1000

    async def hear(self, samples: np.ndarray) -> tuple[int, list[float]]:
        """The index of the first frame `samples` completes, and the speech probabilities of the frames it does."""
        first = self.speech.frames_done
        # Silero in a worker thread, with every session's appends of the moment: the loop keeps serving
        probs = await self.batcher.push(self.speech, samples)
        td = self.session.turn_detection if self.session is not None else None
        if td is not None and td.eagerness is not None:
            await self._ask_ahead(td, first, probs)
        return first, probs

    async def _ask_ahead(self, td: TurnDetection, first: int, probs: list[float]) -> None:
        """Answer the end-of-turn questions that detect() will meet in these frames (see the module's docstring)."""
        # only the silence in progress can still need its answer
        self.complete = {k: v for k, v in self.complete.items() if k == self.silent_since}
        dry = copy.copy(self)  # shares `complete`: the dry run reads on with each answer
        dry.buffer = BufferPreview(self.buffer)
        for found in dry._detect(td, first, probs, asking=True):
            if isinstance(found, EndOfTurnQuestion):
                probability = await self.batcher.turn_complete(found.audio)
                self.complete[found.silent_frame] = probability >= td.eagerness.complete_probability

    def detect(self, td: TurnDetection, first: int, probs: list[float]) -> Iterator[Detection]:
        """Turns from the speech probabilities of frames `first`, `first + 1`, ... of the stream."""
        return self._detect(td, first, probs, asking=False)

    def _detect(
        self, td: TurnDetection, first: int, probs: list[float], asking: bool
    ) -> Iterator[Detection | EndOfTurnQuestion]:
        for i, prob in enumerate(probs, start=first):
            if self.speech_start is None:
                if td.idle_timeout_ms is not None and i * FRAME_MS - self.idle_from_ms >= td.idle_timeout_ms:
                    yield from self._idle_timeout(i * FRAME_MS)
                if prob >= td.threshold:
                    self.speech_start, self.silent_since = i, None
                    self.buffer.item_id = new_id("item")
                    start_ms = max(0, i * FRAME_MS - td.prefix_padding_ms, self.buffer.offset * 1000 // SAMPLE_RATE)
                    yield SpeechStarted(self.buffer.item_id, start_ms, i * FRAME_MS * SAMPLE_RATE // 1000)
                continue
            if prob >= td.threshold - NEG_THRESHOLD_GAP:
                if self.ending:
                    self.ending = False
                    yield SpeechResumed(self.buffer.item_id)
                self.silent_since = None
                continue
            if self.silent_since is None:
                self.silent_since = i
            silent_ms = (i + 1 - self.silent_since) * FRAME_MS
            ready = silent_ms >= min(self.tail_ms, td.silence_duration_ms)  # the turn's audio is all here
            if asking and ready and td.eagerness is not None and self.silent_since not in self.complete:
                yield EndOfTurnQuestion(self.silent_since, self._turn_audio(td, self.silent_since))
            if silent_ms >= self._silence_needed(td):
                yield from self._end_speech(td, self.silent_since, i + 1)
            elif silent_ms >= self.tail_ms and not self.ending:  # the turn's audio is all here, if it ends
                self.ending = True
                yield TurnEnding(self.buffer.item_id, self._turn_audio(td, self.silent_since))
        if self.speech_start is None:  # keep only the padding a next turn may start with (or the idle audio)
            keep_from = self.speech.frames_done * FRAME_MS - td.prefix_padding_ms
            if td.idle_timeout_ms is not None:
                keep_from = min(keep_from, self.idle_from_ms)
            self.buffer.drop_before(max(0, keep_from) * SAMPLE_RATE // 1000)

    def _silence_needed(self, td: TurnDetection) -> int:
        """The silence that ends the open turn: server_vad's; under semantic_vad a complete turn's, or the maximum
        wait while the model has not said the turn is complete."""
        if td.eagerness is None or self.complete.get(self.silent_since):
            return td.silence_duration_ms
        return td.eagerness.max_wait_ms

    def _turn_audio(self, td: TurnDetection, silent_frame: int) -> np.ndarray:
        """The open turn's audio if its speech ended at `silent_frame`: its prefix padding, the speech, the tail."""
        tail_ms = min(self.tail_ms, td.silence_duration_ms)
        return self.buffer.buffered(self.turn_start(td), (silent_frame * FRAME_MS + tail_ms) * SAMPLE_RATE // 1000)

    def _end_speech(self, td: TurnDetection, silent_frame: int, end_frame: int) -> Iterator[Detection]:
        yield SpeechStopped(self.buffer.item_id, silent_frame * FRAME_MS)
        yield Turn(self.buffer.item_id, self._turn_audio(td, silent_frame))
        end = end_frame * FRAME_MS * SAMPLE_RATE // 1000
        self.buffer.drop_before(end)
        self.speech_start = self.silent_since = self.buffer.item_id = None
        self.ending = False
        self.idle_from = end

    def _idle_timeout(self, now_ms: int) -> Iterator[Detection]:
        """The quiet audio since idle_from is committed as a turn (the model may hear speech the VAD did not)."""
        item_id = new_id("item")
        yield IdleTimeout(item_id, self.idle_from_ms, now_ms)
        start = self.idle_from
        end = now_ms * SAMPLE_RATE // 1000
        yield Turn(item_id, self.buffer.buffered(start, end))
        self.buffer.drop_before(end)
        self.idle_from = end
