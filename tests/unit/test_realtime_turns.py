"""Server VAD's turns from speech probabilities (server/realtime/turns.py TurnDetector): where a turn's audio starts
and ends, and the early notice of its end (TurnEnding) that lets its final decode start while the VAD waits."""

from __future__ import annotations

import types

import numpy as np

from server.realtime.buffers import InputBuffer
from server.realtime.load import SharedLoad
from server.realtime.session import TurnDetection
from server.realtime.turns import FRAME_MS, SpeechResumed, SpeechStarted, SpeechStopped, Turn, TurnDetector, TurnEnding
from server.settings import Settings

FRAME = FRAME_MS * 16  # samples per frame at 16 kHz
TD = TurnDetection(threshold=0.5, prefix_padding_ms=64, silence_duration_ms=320, idle_timeout_ms=None)


class _Batcher:
    """detect() reads the probabilities it is given (only hear() would run Silero) and how far the stream is."""

    def __init__(self, frames: int):
        self.frames = frames

    def stream(self):
        return types.SimpleNamespace(frames_done=self.frames)


def _detect(probs: list[float], tail_ms: int, td: TurnDetection = TD) -> list:
    buffer = InputBuffer("audio/pcm", Settings(), SharedLoad())
    buffer.add(np.arange(len(probs) * FRAME, dtype=np.float32))  # each sample holds its stream position
    return list(TurnDetector(_Batcher(len(probs)), buffer, tail_ms).detect(td, 0, probs))


def _span(audio: np.ndarray) -> tuple[int, int]:
    return int(audio[0]), int(audio[-1]) + 1


def test_a_turn_runs_from_its_prefix_padding_to_its_tail_and_its_end_is_announced_early():
    found = _detect([0.0] * 10 + [0.9] * 20 + [0.0] * 20, tail_ms=96)
    assert [type(f) for f in found] == [SpeechStarted, TurnEnding, SpeechStopped, Turn]
    started, ending, stopped, turn = found
    assert started.audio_start_ms == 10 * FRAME_MS - 64 and stopped.audio_end_ms == 30 * FRAME_MS
    # from 64 ms before the speech to 96 ms after it (not to the end of the 320 ms the VAD waited)
    assert _span(turn.audio) == ((10 * FRAME_MS - 64) * 16, (30 * FRAME_MS + 96) * 16)
    assert ending.item_id == turn.item_id and np.array_equal(ending.audio, turn.audio)


def test_speech_resuming_within_the_wait_takes_the_notice_back_and_the_turn_goes_on():
    probs = [0.0] * 5 + [0.9] * 20 + [0.0] * 5 + [0.9] * 10 + [0.0] * 12
    found = _detect(probs, tail_ms=96)
    kinds = [type(f) for f in found]
    assert kinds == [SpeechStarted, TurnEnding, SpeechResumed, TurnEnding, SpeechStopped, Turn]
    assert len({f.item_id for f in found}) == 1  # one turn
    first_notice, last_notice, turn = found[1], found[3], found[5]
    assert _span(turn.audio) == ((5 * FRAME_MS - 64) * 16, (40 * FRAME_MS + 96) * 16)
    assert len(first_notice.audio) < len(turn.audio) and np.array_equal(last_notice.audio, turn.audio)


def test_no_early_notice_when_the_tail_is_the_whole_silence():
    found = _detect([0.9] * 10 + [0.0] * 12, tail_ms=320)
    assert [type(f) for f in found] == [SpeechStarted, SpeechStopped, Turn]
    assert _span(found[2].audio)[1] == (10 * FRAME_MS + 320) * 16


def test_the_buffer_forgets_what_comes_before_a_position_and_keeps_every_later_sample():
    """A silent stream's buffer drops all but its padding after every pass (drop_before), chunk by chunk: what is
    left is exactly the stream from that position on, however the chunks fall."""
    rng = np.random.default_rng(3)
    load = SharedLoad()
    buffer = InputBuffer("audio/pcm", Settings(), load)
    stream = np.arange(20_000, dtype=np.float32)  # each sample holds its stream position
    at, position = 0, 0
    while at < len(stream):
        size = int(rng.integers(1, 900))
        buffer.add(stream[at : at + size])
        at += size
        position = min(at, position + int(rng.integers(0, 1200)))  # now and then all of it
        buffer.drop_before(position)
        assert buffer.offset == position
        kept = buffer.buffered(buffer.offset, buffer.end)
        assert np.array_equal(kept, stream[buffer.offset : at])
        assert buffer.num_samples == len(kept) == load.buffered_samples
