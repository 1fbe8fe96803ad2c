"""Packing speech spans into windows, and mapping window positions back to the original audio."""

from __future__ import annotations

import random

import pytest

from engine.transcription.span_packing import Piece, Window, pack_spans, split_long


def test_consecutive_spans_fill_windows_in_order():
    windows = pack_spans([(0, 10), (20, 35), (50, 60), (70, 95)], max_length=30)
    assert [w.pieces for w in windows] == [
        (Piece(0, 10, 0), Piece(20, 35, 10)),
        (Piece(50, 60, 0),),
        (Piece(70, 95, 0),),
    ]
    assert [w.length for w in windows] == [25, 10, 25]
    assert [(w.start, w.end) for w in windows] == [(0, 35), (50, 60), (70, 95)]


def test_a_span_that_exactly_fills_a_window_and_empty_spans():
    windows = pack_spans([(0, 30), (30, 30), (40, 45)], max_length=30)
    assert [w.pieces for w in windows] == [(Piece(0, 30, 0),), (Piece(40, 45, 0),)]
    assert pack_spans([], max_length=30) == []


def test_long_spans_are_split_into_equal_parts_that_fit():
    assert split_long([(0, 100)], 30) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert split_long([(5, 35)], 30) == [(5, 35)]
    windows = pack_spans([(0, 10), (10, 75)], max_length=30)
    assert all(w.length <= 30 for w in windows)
    covered = [(p.start, p.end) for w in windows for p in w.pieces]
    assert covered == [(0, 10), (10, 31), (31, 53), (53, 75)]  # nothing lost, nothing doubled


def test_unsorted_or_overlapping_spans_are_a_bug():
    with pytest.raises(AssertionError):
        pack_spans([(10, 20), (15, 30)], max_length=30)


def test_to_original_inside_pieces_is_exact():
    window = Window((Piece(100, 110, 0), Piece(200, 215, 10), Piece(500, 505, 25)))
    assert window.length == 30
    assert window.to_original(0) == 100
    assert window.to_original(7.5) == 107.5
    assert window.to_original(12) == 202
    assert window.to_original(27) == 502


def test_a_time_on_a_join_starts_the_later_piece_and_ends_the_earlier_one():
    window = Window((Piece(100, 110, 0), Piece(200, 215, 10)))
    assert window.to_original(10) == 200
    assert window.to_original(10, is_end=True) == 110
    assert window.to_original(0, is_end=True) == 100


def test_positions_outside_the_window_are_clamped():
    window = Window((Piece(100, 110, 0), Piece(200, 215, 10)))
    assert window.to_original(-3) == 100
    assert window.to_original(40) == 215
    assert window.to_original(40, is_end=True) == 215


def test_random_spans_round_trip():
    rng = random.Random(0)
    for _ in range(200):
        spans, t = [], 0
        for _ in range(rng.randint(0, 12)):
            t += rng.randint(0, 50)
            length = rng.randint(1, 120)
            spans.append((t, t + length))
            t += length
        windows = pack_spans(spans, max_length=100)
        assert all(0 < w.length <= 100 for w in windows)
        # every original position of every span is reached from exactly one window position, in order
        mapped = [w.to_original(k) for w in windows for k in range(w.length)]
        assert mapped == [float(x) for start, end in spans for x in range(start, end)]


def test_a_range_barely_over_a_join_moves_to_the_other_side():
    window = Window((Piece(100, 110, 0), Piece(200, 215, 10), Piece(215, 230, 25)))
    # starts 2 before the join, ends well after: the start is padding of the first piece
    assert window.span_to_original(8, 14, margin=3) == (200, 204)
    assert window.span_to_original(6, 14, margin=3) == (106, 204)  # further than the margin: kept
    # ends 2 after the join, started well before: the end is padding of the second piece
    assert window.span_to_original(4, 12, margin=3) == (104, 110)
    assert window.span_to_original(4, 12, margin=0) == (104, 202)
    # barely over on both sides: the shorter side goes
    assert window.span_to_original(8, 11, margin=3) == (108, 110)
    assert window.span_to_original(9, 12, margin=3) == (200, 202)
    # pieces contiguous in the original have no gap to jump
    assert window.span_to_original(23, 27, margin=3) == (213, 217)
    assert window.span_to_original(2, 8, margin=3) == (102, 108)
