"""Real speech with a pause inserted mid-sentence ("Today only platforms one and ... three are used."): a turn that
semantic_vad keeps whole and a fixed silence splits (tests of realtime turn detection, benchmarks/semantic_turns.py).

The clip is cut at its quietest 20 ms near the cut (between two words, not inside one), and the pause is digital
silence.
"""

from __future__ import annotations

import numpy as np

from tests.helpers.data import DATA

RATE = 16000
# "Today only platforms one and | three are used.": cut after "and" (2.66 s)
PLATFORMS = ("g1_en_platforms.wav", 2.66)


def gap_near(audio: np.ndarray, seconds: float, within_s: float = 0.15) -> int:
    """The middle of the quietest 20 ms of `audio` within `within_s` of `seconds`."""
    frame, target, reach = RATE // 50, int(seconds * RATE), int(within_s * RATE)
    starts = range(max(0, target - reach), min(len(audio) - frame, target + reach), frame // 4)
    return min(starts, key=lambda s: float(np.square(audio[s : s + frame]).mean())) + frame // 2


def with_pause(audio: np.ndarray, cut: int, pause_s: float) -> np.ndarray:
    """`audio` with `pause_s` of silence inserted at sample `cut`."""
    return np.concatenate([audio[:cut], np.zeros(int(pause_s * RATE), np.float32), audio[cut:]])


def paused_utterance(pause_s: float = 1.2, clip: tuple[str, float] = PLATFORMS) -> tuple[np.ndarray, int, int]:
    """(16 kHz samples, where the pause starts, where the speech ends): the clip with `pause_s` of silence
    inserted mid-sentence, then 1 s of silence."""
    from engine import decode_audio

    audio = decode_audio(DATA / clip[0])
    cut = gap_near(audio, clip[1])
    speech_end = len(audio) + int(pause_s * RATE)
    return np.concatenate([with_pause(audio, cut, pause_s), np.zeros(RATE, np.float32)]), cut, speech_end
