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
    deltas = _run(["And so my fell", "And so my fellow Americans", "And so my fellow Americans ask not"])
    # "fell" was a word cut short, "Americans" and "not" where the later decodes' audio was cut; the previous
    # decode's last word goes out once the next one heard more after it and agrees
    assert deltas == ["And so my", " fellow Americans"]


def test_a_later_decode_rewriting_punctuation_or_case_of_sent_words_does_not_stop_the_deltas():
    decodes = [
        "And so my fellow",
        "And so my fellow Americans.",  # "And so my" sent
        "And so, my fellow Americans, ask",  # a comma inside the sent words: the deltas go on
        "And so, my Fellow Americans, ask not what",
        "And so, my fellow Americans, ask not what your country",
    ]
    deltas = _run(decodes)
    assert deltas == ["And so my fellow", " Americans,", " ask", " not what"]
    keys = ["and", "so", "my", "fellow", "americans", "ask", "not", "what"]
    assert [word_key(w) for w in "".join(deltas).split()] == keys


def test_the_final_transcript_continues_after_the_words_sent():
    partials = Partials()
    for text in ["And so mine", "And so my fellow Americans"]:
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
    assert deltas == ["one two three four"]


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

    def launches(delay: str | None, seconds: float, busy: int = 0) -> tuple[list[float], int]:
        """When partial decodes are due while `seconds` of speech arrive in 0.1 s appends, each finished at once
        with one word more than the one before (`busy`: other sessions' partial decodes in flight meanwhile)."""
        load = SharedLoad()
        load.partials_in_flight = busy
        buffer = InputBuffer("audio/pcm", settings, load)
        scheduler = PartialScheduler(buffer, load)
        scheduler.set_delay(delay)
        scheduler.restart()
        times, agreeing = [], None
        for step in range(1, round(seconds * 10) + 1):
            buffer.add(np.zeros(SAMPLE_RATE // 10, dtype=np.float32))
            launched = scheduler.launch(buffer.offset)
            if launched is not None:
                times.append(round(step / 10, 1))
                agreeing = launched[1].agreeing
                launched[1].agree(" ".join(f"w{i}" for i in range(len(times))))
                scheduler.finished(launched[1])
        return times, agreeing

    # the default, medium: two decodes a second, two agreeing; until the first delta (the second decode agrees
    # on its first word), twice as often, whatever other sessions' previews are in flight meanwhile
    assert launches(None, 4.0) == ([0.3, 0.6, 1.1, 1.6, 2.1, 2.6, 3.1, 3.6], 2) == launches("medium", 4.0)
    assert launches("medium", 2.0, busy=1) == ([0.3, 0.6, 1.1, 1.6], 2)
    # low sends a decode's words but its last: the first decode heard one word, which waits for the second
    assert launches("low", 2.0) == ([0.3, 0.6, 1.1, 1.6], 1)
    # 0.25 s in appends of 0.1 s: every third append; 0.125 s until the first delta: every second
    assert launches("minimal", 1.0) == ([0.2, 0.4, 0.7, 1.0], 1)
    assert {d: (len(times), agreeing) for d, (times, agreeing) in ((d, launches(d, 4.0)) for d in DELAYS)} == {
        "minimal": (14, 1), "low": (8, 1), "medium": (8, 2), "high": (5, 2), "xhigh": (3, 2)
    }  # fmt: skip


def test_a_turns_first_partial_is_due_counting_from_its_first_speech_frame():
    load = SharedLoad()
    buffer = InputBuffer("audio/pcm", Settings(), load)
    scheduler = PartialScheduler(buffer, load)
    scheduler.set_delay("low")  # the first decode 0.25 s after the voice starts
    buffer.add(np.zeros(SAMPLE_RATE, dtype=np.float32))
    scheduler.restart(voice_at=SAMPLE_RATE * 9 // 10)  # the server VAD heard the voice 0.1 s before the append's end
    buffer.add(np.zeros(SAMPLE_RATE // 10, dtype=np.float32))
    assert scheduler.launch(buffer.offset) is None  # 0.2 s of voice
    buffer.add(np.zeros(SAMPLE_RATE // 10, dtype=np.float32))
    assert scheduler.launch(buffer.offset) is not None  # 0.3 s: counted from the voice, not from the append
    scheduler = PartialScheduler(buffer, load)
    scheduler.set_delay("low")
    scheduler.restart()  # no voice position (a cleared buffer): counted from what the buffer holds now
    buffer.add(np.zeros(SAMPLE_RATE // 5, dtype=np.float32))
    assert scheduler.launch(buffer.offset) is None


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


def test_partial_decodes_wait_for_finals_unless_told_not_to_and_stay_under_the_cap():
    def launched(load: SharedLoad) -> bool:
        buffer = InputBuffer("audio/pcm", Settings(), load)
        scheduler = PartialScheduler(buffer, load)
        scheduler.restart()
        buffer.add(np.zeros(SAMPLE_RATE, dtype=np.float32))
        return scheduler.launch(buffer.offset) is not None

    waiting, not_waiting = SharedLoad(), SharedLoad(max_partials=32, partials_wait_for_finals=False)
    for load, wanted in ((waiting, False), (not_waiting, True)):
        load.finals_in_flight = 1  # another session's turn is being transcribed
        assert launched(load) is wanted
    not_waiting.partials_in_flight = 32  # the cap holds whatever the finals
    assert not launched(not_waiting)


def test_a_freed_partial_slot_goes_to_a_turn_without_deltas_first_then_to_the_one_waiting_longest():
    settings = Settings()
    load = SharedLoad(max_partials=1, partials_wait_for_finals=False)
    launched: list[tuple[str, object]] = []

    def session(name: str) -> tuple[InputBuffer, PartialScheduler]:
        buffer = InputBuffer("audio/pcm", settings, load)
        scheduler = PartialScheduler(buffer, load, lambda: launch(name, buffer, scheduler))
        scheduler.restart()
        return buffer, scheduler

    def launch(name: str, buffer: InputBuffer, scheduler: PartialScheduler) -> None:
        found = scheduler.launch(buffer.offset)
        if found is not None:
            launched.append((name, found[1]))

    sessions = {name: session(name) for name in ("talking", "late", "new", "gone")}
    for buffer, _ in sessions.values():
        buffer.add(np.zeros(SAMPLE_RATE, dtype=np.float32))  # a second of the turn: each one's decode is due
    # "talking" takes the one slot; its turn sends words, so its next decode waits behind turns that sent none
    launch("talking", *sessions["talking"])
    for name in ("late", "gone", "new"):
        launch(name, *sessions[name])  # due, no slot: they wait, in this order
    assert [name for name, _ in launched] == ["talking"] and len(load.waiting_partials) == 3
    sessions["gone"][1].withdraw()  # that session closed
    talking = launched[0][1]
    talking.agree("one two three")
    sessions["talking"][0].add(np.zeros(SAMPLE_RATE, dtype=np.float32))

    def finish_next() -> str:
        name, partials = launched[-1]
        sessions[name][1].finished(partials)  # the freed slot is handed on at once
        return launched[-1][0]

    sessions["talking"][1].finished(talking)
    launch("talking", *sessions["talking"])  # due again: waits now, behind the two without deltas
    assert launched[-1][0] == "late" and list(load.waiting_partials) == [sessions["new"][1], sessions["talking"][1]]
    assert finish_next() == "new"  # "late" finished: "new" has sent no delta, "talking" has
    assert finish_next() == "talking"
    assert load.waiting_partials == {} and load.partials_in_flight == 1


def test_after_a_decode_that_sent_nothing_the_next_comes_at_half_the_delays_pace():
    def launches(texts: list[str], busy: int = 0) -> list[float]:
        """When a low-delay turn's decodes launch as 0.1 s appends arrive, each finished at once with the next of
        `texts` (`busy`: other sessions' decodes in flight from the third on)."""
        load = SharedLoad()
        buffer = InputBuffer("audio/pcm", Settings(), load)
        scheduler = PartialScheduler(buffer, load)
        scheduler.set_delay("low")  # a decode each 0.5 s, its words but the last sent at once
        scheduler.restart()
        times, left = [], iter(texts)
        for step in range(1, 26):
            buffer.add(np.zeros(SAMPLE_RATE // 10, dtype=np.float32))
            launched = scheduler.launch(buffer.offset)
            if launched is not None:
                times.append(round(step / 10, 1))
                launched[1].agree(next(left))
                scheduler.finished(launched[1])
                load.partials_in_flight = busy if len(times) >= 2 else 0
        return times

    # the first decode comes at half the pace too (nothing is sent yet); the third adds no word before its last
    # ("three" waits for the next decode): the next comes sooner
    texts = ["one two", "one two three", "one two three", "one two three four five", "one two three four five six"]
    assert launches(texts) == [0.3, 0.8, 1.3, 1.6, 2.1]
    assert launches(texts, busy=1) == [0.3, 0.8, 1.3, 1.8, 2.3]  # others' decodes in flight: no extra
    # the first decode heard one word, which waits: the second comes sooner too
    assert launches(["one", "one two", "one two three", "one two three four", "one two three four five"]) == [
        0.3, 0.6, 1.1, 1.6, 2.1
    ]  # fmt: skip
