"""keywords[] with an empty entry is refused by name (400), as other bad fields are; it was dropped silently."""

from __future__ import annotations

import pytest

from server.errors import APIError
from server.parsing.fields import parse_keywords
from tests.unit.test_parsing import error_of, parse, raw_form, transcribe


@pytest.mark.parametrize("values", [[""], ["   "], ["Kubernetes", ""], []])
def test_empty_keywords_are_refused(values):
    with pytest.raises(APIError) as exc:
        parse_keywords(values)
    assert exc.value.status_code == 400 and exc.value.param == "keywords[]" and exc.value.code == "invalid_value"


def test_an_empty_keyword_on_the_wire_is_a_400():
    err = error_of(transcribe(keywords=["Kubernetes", ""]))
    assert err.status_code == 400 and err.param == "keywords[]"
    assert error_of(raw_form({"model": "whisper-1", "keywords[]": " "})).param == "keywords[]"


def test_no_keywords_and_real_keywords_still_parse():
    assert parse_keywords(None) == ()
    assert parse(transcribe(keywords=["Hester  Prynne"])).keywords == ("Hester Prynne",)
