"""Which words of a turn's successive partial decodes go out as deltas (server/realtime/partials.py Partials)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SAMPLE_RATE
from server.realtime.buffers import InputBuffer
from server.realtime.load import SharedLoad
from server.realtime.partials import DELAYS, Partials, PartialScheduler, word_key
from server.realtime.session import SessionConfig, SessionError
from server.settings import Settings


def _run(decodes: list[str]) -> list[str]:
    partials, deltas = Partials(), []
    for text in decodes:
        start, end = partials.agree(text)
        if end > start:
            deltas.append(text[start:end])
    assert "".join(deltas) == partials.sent_text
    return deltas


def test_words_two_decodes_agree_on_go_out_and_the_last_word_waits():
    deltas = _run(["And so my", "And so my fellow Americans", "And so my fellow Americans ask not"])
    assert deltas == ["And so", " my fellow"]  # "Americans" was where the second decode's audio was cut


def test_a_later_decode_rewriting_punctuation_or_case_of_sent_words_does_not_stop_the_deltas():
    decodes = [
        "And so my fellow",
        "And so my fellow Americans.",  # "And so my" sent
        "And so, my fellow Americans, ask",  # a comma inside the sent words: the deltas go on
        "And so, my Fellow Americans, ask not what",
        "And so, my fellow Americans, ask not what your country",
    ]
    deltas = _run(decodes)
    assert deltas == ["And so my", " fellow", " Americans,", " ask not"]
    assert [word_key(w) for w in "".join(deltas).split()] == ["and", "so", "my", "fellow", "americans", "ask", "not"]


def test_the_final_transcript_continues_after_the_words_sent():
    partials = Partials()
    for text in ["And so my", "And so my fellow Americans"]:
        partials.agree(text)
    assert partials.sent_text == "And so"
    final = "And so my fellow Americans, ask not what your country can do for you."
    assert final[partials.rest(final) :] == " my fellow Americans, ask not what your country can do for you."
    final = "And so, my fellow Americans, ask not."  # still continues the sent text: the deltas join into it
    assert partials.sent_text + final[partials.rest(final) :] == final
    final = "and so my fellow Americans, ask not."  # a sent word's case changed: after as many words
    assert final[partials.rest(final) :] == " my fellow Americans, ask not."


def test_nothing_is_sent_twice_when_a_decode_agrees_on_fewer_words():
    deltas = _run(["one two three four", "one two three four five", "one two", "one two three four five six"])
    assert deltas == ["one two three"]


def test_with_one_agreeing_decode_a_decodes_words_but_its_last_go_out_at_once():
    partials, deltas = Partials(agreeing=1), []
    for text in ["And so", "And so my fellow", "And so, my fellow Americans ask"]:
        start, end = partials.agree(text)
        if end > start:
            deltas.append(text[start:end])
    assert deltas == ["And", " so my", " fellow Americans"]


def test_the_sessions_delay_sets_how_often_the_open_turn_is_decoded_and_how_many_decodes_agree():
    settings = Settings()
    session = SessionConfig(settings)
    assert session.delay is None and "delay" not in session.body()["audio"]["input"]["transcription"]
    session.update({"type": "transcription", "audio": {"input": {"transcription": {"delay": "low"}}}})
    assert session.delay == "low" and session.body()["audio"]["input"]["transcription"]["delay"] == "low"
    with pytest.raises(SessionError) as info:
        session.update({"type": "transcription", "audio": {"input": {"transcription": {"delay": "fast"}}}})
    assert "delay" in info.value.param and session.delay == "low"

    def launches(delay: str | None, seconds: float) -> tuple[int, int]:
        """Partial decodes due while `seconds` of speech arrive in 0.1 s appends, each finished at once."""
        load = SharedLoad()
        buffer = InputBuffer("audio/pcm", settings, load)
        scheduler = PartialScheduler(buffer, load)
        scheduler.set_delay(delay)
        scheduler.restart()
        count, agreeing = 0, None
        for _ in range(round(seconds * 10)):
            buffer.add(np.zeros(SAMPLE_RATE // 10, dtype=np.float32))
            launched = scheduler.launch(buffer.offset)
            if launched is not None:
                count, agreeing = count + 1, launched[1].agreeing
                scheduler.finished(launched[1])
        return count, agreeing

    assert launches(None, 4.0) == (8, 2) == launches("medium", 4.0)  # the default: two a second, two agreeing
    # 0.25 s in appends of 0.1 s: every third append
    assert {d: launches(d, 4.0) for d in DELAYS} == {
        "minimal": (13, 1), "low": (8, 1), "medium": (8, 2), "high": (4, 2), "xhigh": (2, 2)
    }  # fmt: skip


def test_a_decode_that_heard_a_word_more_or_less_before_the_sent_ones_neither_repeats_nor_skips_one():
    partials, deltas = Partials(agreeing=1), []
    for text in [
        "And so my fellow Americans",
        "And so, my, my fellow Americans ask not",
        "And so fellow Americans ask not what",
    ]:
        start, end = partials.agree(text)
        if end > start:
            deltas.append(text[start:end])
    assert deltas == ["And so my fellow", " Americans ask", " not"]
    final = "And so my dear fellow Americans, ask not what your country can do."
    assert final[partials.rest(final) :] == " what your country can do."
