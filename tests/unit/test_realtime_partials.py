"""Which words of a turn's successive partial decodes go out as deltas (server/realtime/partials.py Partials)."""

from __future__ import annotations

from server.realtime.partials import Partials, word_key


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
