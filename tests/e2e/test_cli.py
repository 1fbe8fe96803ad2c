"""`whisper-server transcribe` prints through the same formatting as the HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys

import srt
from openai.types.audio import TranscriptionVerbose

from tests.helpers.server import REPO
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=600
    )


def test_transcribe_text_and_srt(data_dir):
    done = cli("transcribe", str(data_dir / JFK))
    assert done.returncode == 0, done.stderr
    assert contains_words(done.stdout, JFK_WORDS)
    done = cli("transcribe", str(data_dir / JFK), "--output-format", "srt", "--language", "en")
    assert done.returncode == 0, done.stderr
    assert contains_words(" ".join(s.content for s in srt.parse(done.stdout)), JFK_WORDS)


def test_transcribe_verbose_json_matches_server(server, data_dir):
    done = cli("transcribe", str(data_dir / JFK), "--output-format", "verbose_json")
    assert done.returncode == 0, done.stderr
    from_cli = TranscriptionVerbose.model_validate(json.loads(done.stdout))
    from_server = server.client().audio.transcriptions.create(
        file=data_dir / JFK, model="whisper-1", response_format="verbose_json"
    )
    assert from_cli.text == from_server.text
    assert [s.start for s in from_cli.segments] == [s.start for s in from_server.segments]


def test_transcribe_several_files_and_a_bad_one(data_dir, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio")
    done = cli("transcribe", str(data_dir / JFK), str(bad), str(data_dir / "g4_en_jfk.mp3"))
    assert done.returncode == 1
    assert "bad.wav" in done.stderr
    assert done.stdout.count("==> ") == 2


def test_bad_flags_exit_2():
    assert cli("serve", "--port", "not-a-port").returncode == 2
    assert cli("serve", "--device", "tpu").returncode == 2
    assert cli("transcribe", "x.wav", "--language", "klingon").returncode == 2


def test_translate_on_english_only_model_is_a_usage_error(data_dir):
    done = cli("transcribe", str(data_dir / JFK), "--task", "translate")
    assert done.returncode == 2 and "English-only" in done.stderr
