"""Words to speakers: a segment splits where the speaker at its words' midpoints changes."""

from engine import Segment, SpeakerTurn, Word, diarized_segments, speaker_labels


def segment(words: list[tuple[str, float, float]], text: str | None = None) -> Segment:
    ws = [Word(w, s, e, 0.9) for w, s, e in words]
    return Segment(0, 0, ws[0].start if ws else 0.0, ws[-1].end if ws else 1.0,
                   text if text is not None else "".join(w.word for w in ws), [], 0.0, -0.1, 1.0, 0.0,
                   ws or None)  # fmt: skip


def test_a_segment_splits_where_the_speaker_changes_and_words_near_a_turn_join_it():
    turns = [SpeakerTurn(0.0, 2.0, 0), SpeakerTurn(2.3, 4.0, 1), SpeakerTurn(4.5, 6.0, 0)]
    seg = segment([(" Hello", 0.1, 0.5), (" there.", 0.6, 1.9), (" Hi", 2.1, 2.4), (" you.", 2.5, 3.0),
                   (" Back", 4.4, 4.6), (" again", 4.7, 5.0)])  # fmt: skip
    out = diarized_segments([seg], turns)
    assert [(s.text, s.speaker) for s in out] == [("Hello there.", 0), ("Hi you.", 1), ("Back again", 0)]
    assert (out[1].start, out[1].end) == (2.1, 3.0)  # " Hi" (midpoint 2.25, in no turn) goes to the nearest


def test_a_segment_without_word_times_goes_to_the_speaker_it_overlaps_most():
    turns = [SpeakerTurn(0.0, 1.0, 0), SpeakerTurn(1.0, 5.0, 1)]
    seg = Segment(0, 0, 0.5, 3.0, " Words without times.", [], 0.0, -0.1, 1.0, 0.0)
    assert [(s.text, s.speaker) for s in diarized_segments([seg], turns)] == [("Words without times.", 1)]
    assert diarized_segments([seg], [])[0].speaker == 0


def test_speaker_labels_are_openais_letters():
    assert speaker_labels(3) == ["A", "B", "C"]
    assert speaker_labels(28)[25:] == ["Z", "AA", "AB"]
