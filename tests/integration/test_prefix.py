"""A decode given the start of its transcript (DecodeOptions.prefix, openai/whisper's): the tokens follow the start
of transcript as if decoded, and the result is what the decode adds after them. The realtime API's partial decodes
pass the words a turn's earlier decodes agreed on, so that a refresh decodes only the new words."""

from __future__ import annotations

import dataclasses

import pytest

from engine.request import DecodeOptions, InvalidRequestError
from tests.helpers.engine_runs import WAIT_S

TEXT = DecodeOptions(temperatures=(0.0,), without_timestamps=True)
CLIPS = ("g1_en_jfk.flac", "g1_en_librispeech-test-clean_1221-135766-0001.wav")


@pytest.mark.parametrize("name", CLIPS)
def test_a_prefix_of_the_transcript_is_continued_with_the_rest(tiny_engine, load_clip, name):
    audio = load_clip(name)
    free = tiny_engine.submit(audio, TEXT).wait(timeout=WAIT_S)
    words = free.text.split()
    head = " ".join(words[: len(words) // 2])
    continued = tiny_engine.submit(audio, dataclasses.replace(TEXT, prefix=head)).wait(timeout=WAIT_S)
    # only the continuation comes back, and the prefix and it are the transcript decoded without one
    assert not continued.text.startswith(head)
    assert f"{head} {continued.text}".split() == words, (head, continued.text, free.text)
    assert continued.num_tokens < free.num_tokens


def test_a_prefix_that_leaves_nothing_to_add_ends_the_text(tiny_engine, load_clip):
    audio = load_clip(CLIPS[0])
    free = tiny_engine.submit(audio, TEXT).wait(timeout=WAIT_S)
    rest = tiny_engine.submit(audio, dataclasses.replace(TEXT, prefix=free.text)).wait(timeout=WAIT_S)
    assert len(rest.text.split()) <= 1  # Whisper suppresses the end right after the start of its text: one token


def test_a_prefix_is_bounded_and_needs_text_only_decoding(tiny_engine, load_clip):
    with pytest.raises(ValueError, match="without_timestamps"):
        DecodeOptions(prefix="And so")
    with pytest.raises(InvalidRequestError, match="prefix takes"):
        tiny_engine.submit(load_clip(CLIPS[0]), dataclasses.replace(TEXT, prefix="word " * 400))
