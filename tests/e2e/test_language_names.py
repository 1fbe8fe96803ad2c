"""verbose_json names the detected language in full ("german", not "de"), as OpenAI does, in both modes."""

from __future__ import annotations

import pytest
from openai.types.audio import TranscriptionVerbose

CLIPS = {
    "g3_de_picovoice-leopard_test_de.wav": "german",
    "g3_ja_fleurs_1837.wav": "japanese",
    "g3_zh_aishell_BAC009S0724W0121.wav": "chinese",
    "g3_ru_deepspeech-smoke.wav": "russian",
    "g3_sv_nst_se10x016-08071999-1334_u0016004.wav": "swedish",
}
LONG_GERMAN = "g3_de_librivox_simplicissimus-titlepage.mp3"  # 68 s: several windows in chunked mode


@pytest.mark.parametrize("clip", CLIPS)
def test_verbose_json_language_is_the_full_name(base_server, data_dir, clip):
    result = base_server.client().audio.transcriptions.create(
        file=data_dir / clip, model="whisper-1", response_format="verbose_json"
    )
    assert isinstance(result, TranscriptionVerbose)
    assert result.language == CLIPS[clip]


def test_chunked_mode_detects_and_names_the_language(base_server, data_dir):
    result = base_server.client().audio.transcriptions.create(
        file=data_dir / LONG_GERMAN,
        model="whisper-1",
        response_format="verbose_json",
        chunking_strategy={"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500},
    )
    assert result.language == "german"
    assert len(result.segments) >= 3 and result.segments[-1].end <= result.duration
