"""Chat answers: which templates can stream as the transcript grows, and the cut at max_tokens."""

from __future__ import annotations

from engine import Segment, TokenLogprob
from server.chat_stream import truncate
from server.chat_templates import TEMPLATE_DIR, ChatTemplate


def test_templates_that_render_in_order_stream(tmp_path):
    assert ChatTemplate().incremental
    assert ChatTemplate(TEMPLATE_DIR / "timestamped.jinja").incremental
    (tmp_path / "lang.jinja").write_text("[{{ language }}] {{ text }}")
    (tmp_path / "count.jinja").write_text("{{ segments | length }} segments: {{ text }}")
    assert not ChatTemplate(tmp_path / "lang.jinja").incremental  # the language is known at the end only
    assert not ChatTemplate(tmp_path / "count.jinja").incremental


def segment(i: int, text: str, pieces: list[bytes]) -> Segment:
    logprobs = [TokenLogprob(p.decode("utf-8", "replace"), p, -0.1) for p in pieces]
    return Segment(i, 0, float(i), float(i + 1), text, [], 0.0, -0.1, 1.0, 0.0, logprobs=logprobs)


def test_truncate_cuts_at_a_token_and_never_inside_a_character():
    segments = [
        segment(0, " Hello world.", [b" Hello", b" world", b"."]),
        segment(1, " Caf\u00e9", [b" Caf", b"\xc3", b"\xa9"]),
    ]
    assert truncate(segments, None) == (segments, False)
    assert truncate(segments, 6) == (segments, False)
    kept, cut = truncate(segments, 2)
    assert cut and [s.text for s in kept] == [" Hello world"]
    kept, cut = truncate(segments, 5)  # the last token would be half of "é"
    assert cut and [s.text for s in kept] == [" Hello world.", " Caf"] and len(kept[1].logprobs) == 2
