"""Partial transcripts of the open turn: when its audio so far is decoded again, and which words of those decodes
are sent as `delta` events before the turn is committed.

A partial decode is launched after each `every_s` of new audio in the turn (the session's `delay`: DELAYS; more
often while its words wait, and no other is in flight: WAITING_PACE), one at a time per turn, no more than the server's
cap at once, and none while a final decode is in flight anywhere on the server (SharedLoad): it is only a preview
that the next one replaces, so under load the previews thin out and the finals stay prompt. A turn whose decode is
due while none may start waits for a slot, turns without a delta yet first (SharedLoad.wait_for_partial).
What is sent is never taken back (Partials): the final decode's transcript then sends only what follows it. Words
are compared without their case and punctuation, which later decodes of more audio often rewrite.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

import numpy as np

from engine import SAMPLE_RATE

from .buffers import InputBuffer
from .events import new_id
from .load import SharedLoad

log = logging.getLogger(__name__)

# OpenAI's `audio.input.transcription.delay`, how long live text waits to be surer: (seconds of new audio between
# two partial decodes of the open turn, how many successive decodes must agree on a word before it is sent). With
# one, a decode's words but its last go out at once: the earliest deltas, which a later decode may contradict
# (what is sent stays sent; the completed transcript is the final decode's). `benchmarks/realtime_sessions.py
# --delay` measures each; DEFAULT_DELAY is the session's until it sets one.
DELAYS = {"minimal": (0.25, 1), "low": (0.5, 1), "medium": (0.5, 2), "high": (1.0, 2), "xhigh": (2.0, 2)}
DEFAULT_DELAY = "medium"
# While a turn's words wait, the audio between its partial decodes is this fraction of the delay's: until its first
# delta (what a listener waits for), and after a decode that sent nothing (one that only added its last word, which
# waits for the next: a word a chunk would otherwise send one every other chunk). benchmarks/realtime_sessions.py:
# first delta, longest wait for a delta.
WAITING_PACE = 0.5
# Live deltas cover a turn's first window: past it a partial decode would be long-form, its cost growing with the
# turn at every refresh; the rest of a longer turn comes with its final decode.
MAX_PARTIAL_S = 30.0
WORD = re.compile(r"\S+")
NOT_IN_WORD = re.compile(r"[^\w']+")


def word_key(word: str) -> str:
    """A word as two decodes are compared: its letters, digits and apostrophes, lower case."""
    return NOT_IN_WORD.sub("", word).lower()


class Partials:
    """A turn's live text: the words `agreeing` successive decodes of its growing audio agree on (all but a decode's
    last word) are sent as deltas, never taken back; the final decode's transcript then sends only what follows.

    Words agree when they are the same word, whatever their case and punctuation: a later decode of more audio
    often rewrites those of words already sent (a period becomes a comma once the sentence goes on), and that must
    not stop the deltas. Each delta continues in the newest decode's text after the words sent (`continue_at`)."""

    def __init__(self, agreeing: int = 2) -> None:
        self.agreeing = agreeing  # decodes that must agree on a word (DELAYS): 1, the newest alone
        self.sent_keys: list[str] = []  # the words sent as deltas, as compared (word_key)
        self.sent_text = ""  # the deltas sent, joined
        self.last: list[str] = []  # the previous partial decode's words, as compared (word_key)
        self.in_flight = False
        self.stalled = False  # the last decode sent nothing
        self.done = False  # the final decode has started: late partial results are dropped
        self.prefixed = True  # the words sent still fit as a partial decode's prefix (DecodeOptions.prefix)

    def agree(self, text: str) -> tuple[int, int]:
        """The characters [start, end) of a new partial decode's `text` that can be sent ((0, 0) for none)."""
        spans = [m.span() for m in WORD.finditer(text)]
        keys = [word_key(text[a:b]) for a, b in spans]
        # the last word of a decode is where its audio was cut: it may be a word half heard, so it is not stable
        # yet; the previous decode's last word is, once this one heard more after it and agrees on it (a word cut
        # short would have been heard as another)
        agreed = len(keys) - 1 if self.agreeing == 1 else 0
        while agreed < min(len(keys) - 1, len(self.last)) and keys[agreed] == self.last[agreed]:
            agreed += 1
        self.last = keys
        at = self.continue_at(keys)
        self.stalled = agreed <= at
        if self.stalled:
            return 0, 0
        start, end = spans[at - 1][1] if at else 0, spans[agreed - 1][1]
        self.sent_keys += keys[at:agreed]
        self.sent_text += text[start:end]
        return start, end

    def continue_at(self, keys: list[str]) -> int:
        """How many of a decode's words (`keys`) the deltas sent stand for: as many as were sent where the decode
        begins with them; else where the last two sent words are, nearest to that count (a decode that heard a
        word more or less before them: continuing by the count would repeat or skip one); else that count."""
        sent = self.sent_keys
        n = len(sent)
        if keys[:n] == sent:
            return n
        for at in sorted(range(max(1, n - 2), min(len(keys), n + 2) + 1), key=lambda at: abs(at - n)):
            if keys[at - 1] == sent[-1] and (n < 2 or at < 2 or keys[at - 2] == sent[-2]):
                return at
        return n

    def rest(self, transcript: str) -> int:
        """Where what the final transcript adds to the deltas sent starts (all of it if it does not continue them:
        a partial decode's agreed words the final one does not share are already sent, and they stay sent)."""
        if transcript.startswith(self.sent_text):
            return len(self.sent_text)
        # the final decode changed a sent word, or its case or punctuation: continue after the words sent
        log.debug("a realtime turn's final transcript does not continue its sent deltas")
        spans = [m.span() for m in WORD.finditer(transcript)]
        at = self.continue_at([word_key(transcript[a:b]) for a, b in spans])
        return spans[at - 1][1] if 0 < at <= len(spans) else (0 if at == 0 else len(transcript))


class PartialScheduler:
    """One session's partial decodes: when the open turn in `buffer` gets its next one, and each turn's Partials
    until its final decode takes them."""

    def __init__(self, buffer: InputBuffer, load: SharedLoad, wake: Callable[[], None] = lambda: None) -> None:
        self.buffer = buffer
        self.load = load
        self.wake = wake  # checks again whether a partial decode is due: a slot it waited for is free
        self.turns: dict[str, Partials] = {}
        self.at = 0  # buffered samples when the last partial decode of the open turn was launched
        self.every_s, self.agreeing = DELAYS[DEFAULT_DELAY]

    def set_delay(self, delay: str | None) -> None:
        """The session's `delay` (None: DEFAULT_DELAY), from the next partial decode on."""
        self.every_s, self.agreeing = DELAYS[delay or DEFAULT_DELAY]

    def restart(self, voice_at: int | None = None) -> None:
        """The open turn starts: its first partial is due once interval() of audio follows stream position
        `voice_at` (the server VAD's first speech frame: the append that carried it may hold more), else what
        the buffer holds now."""
        buffer = self.buffer
        self.at = buffer.num_samples - (0 if voice_at is None else max(0, buffer.end - voice_at))
        self.withdraw()

    def withdraw(self) -> None:
        """No longer waiting for a partial decode slot (the turn ended, or the session)."""
        self.load.waiting_partials.pop(self, None)

    def launch(self, start: int | None) -> tuple[str, Partials, np.ndarray] | None:
        """The open turn's item, Partials and audio (from stream position `start`; None: no speech yet) for a
        partial decode if one is due now, counted in flight until finished(); None if not."""
        if start is None:
            return None  # no speech yet
        buffer, load = self.buffer, self.load
        if buffer.num_samples - self.at < self.interval() * SAMPLE_RATE:
            return None
        if buffer.item_id is None:  # manual commits: the turn gets its id with its first partial
            buffer.item_id = new_id("item")
        partials = self.turns.setdefault(buffer.item_id, Partials(self.agreeing))
        if partials.in_flight:
            return None
        if not load.partial_slot_free():
            load.wait_for_partial(self, bool(partials.sent_keys), time.monotonic(), self.wake)
            return None
        self.at = buffer.num_samples
        end = buffer.end
        if end - max(start, buffer.offset) > MAX_PARTIAL_S * SAMPLE_RATE:
            return None  # measured before it is copied: a long manual buffer would be copied at every append
        audio = buffer.buffered(start, end)
        partials.in_flight = True
        load.partials_in_flight += 1
        return buffer.item_id, partials, audio

    def interval(self) -> float:
        """Seconds of new audio before the open turn's next partial decode: WAITING_PACE of the delay's until its
        first delta (what a listener waits for most: the first decode of a few words often holds only one, which
        waits for the next), and after a decode that sent nothing while no other partial decode is in flight on
        the server (on a busy engine, more frequent decodes of less audio would only delay them all); else the
        delay's."""
        partials = self.turns.get(self.buffer.item_id) if self.buffer.item_id is not None else None
        # before the first delta, or stalled on an idle server
        waiting = partials is None or not partials.sent_keys or (partials.stalled and not self.load.partials_in_flight)
        return self.every_s * WAITING_PACE if waiting else self.every_s

    def finished(self, partials: Partials) -> None:
        """A launched partial decode is over (or never reached the engine): the turn and the server may launch
        the next."""
        partials.in_flight = False
        self.load.partial_finished()

    def commit(self, item_id: str) -> None:
        """The turn is committed: a partial decode of it still running is dropped when it ends."""
        partials = self.turns.get(item_id)
        if partials is not None:
            partials.done = True

    def take(self, item_id: str) -> Partials | None:
        """The turn's Partials, for its final decode (None if it had no partial decode)."""
        return self.turns.pop(item_id, None)

    def discard(self, item_id: str | None) -> None:
        """The open turn is cleared: what its partial decodes sent is forgotten, and one still running is dropped."""
        self.withdraw()
        partials = self.turns.pop(item_id, None) if item_id is not None else None
        if partials is not None:
            partials.done = True
