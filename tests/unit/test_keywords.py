"""Keyword biasing's matching (engine/decoding/keywords.py): which tokens get a bonus after a row's text."""

from __future__ import annotations

from engine.decoding.keywords import CONTINUE_BONUS, START_BONUS, KeywordBias

EOT = 100  # tokens from here on are specials and timestamps


def test_first_tokens_are_gated_and_begun_keywords_continue():
    bias = KeywordBias([(1, 2, 3), (1, 5), (7,)])
    start = {1: (START_BONUS, True), 7: (START_BONUS, True)}
    assert bias.bonuses([], EOT) == start
    assert bias.bonuses([9, 1], EOT) == start | {2: (CONTINUE_BONUS, False), 5: (CONTINUE_BONUS, False)}
    assert bias.bonuses([1, 2], EOT) == start | {3: (CONTINUE_BONUS, False)}
    assert bias.bonuses([1, 2, 3], EOT) == start  # a finished keyword continues nothing
    assert bias.bonuses([1, 200, 2], EOT) == start  # a timestamp between breaks the match
    assert bias.bonuses([1, 200], EOT) == start


def test_scale_and_no_keywords():
    assert KeywordBias([(4, 6)], scale=2.0).bonuses([4], EOT)[6] == (2 * CONTINUE_BONUS, False)
    assert KeywordBias([]).bonuses([1, 2], EOT) == {}
