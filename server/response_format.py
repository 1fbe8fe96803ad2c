"""The `response_format` values, apart from the wire types: the command line offers them without importing those."""

from __future__ import annotations

import enum


class ResponseFormat(str, enum.Enum):
    JSON = "json"
    TEXT = "text"
    SRT = "srt"
    VERBOSE_JSON = "verbose_json"
    VTT = "vtt"
    DIARIZED_JSON = "diarized_json"  # transcriptions only: segments with speakers
