"""`whisper-server transcribe` prints through the same formatting as the HTTP server; a wrong argument is one line
on stderr and exit status 2, found before torch or a model loads."""

from __future__ import annotations

import json
import subprocess
import sys

import srt
from openai.types.audio import TranscriptionVerbose

from tests.helpers.server import REPO
from tests.helpers.transcripts import JFK, JFK_WORDS, contains_words


def cli(*args: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *python, "-m", "server", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def imported(done: subprocess.CompletedProcess) -> set[str]:
    """The modules a `python -X importtime` run imported (its stderr lists one per line)."""
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_transcribe_srt(data_dir):
    """srt, the language given. (The default output, text, is read in test_transcribe_several_files_and_a_bad_one.)"""
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
    # each good file's text, in the default output format
    for part in done.stdout.split("==> ")[1:]:
        assert contains_words(part, JFK_WORDS), done.stdout


def test_bad_flags_exit_2():
    assert cli("serve", "--port", "not-a-port").returncode == 2
    assert cli("serve", "--device", "tpu").returncode == 2
    assert cli("transcribe", str(REPO / "tests" / "data" / JFK), "--language", "klingon").returncode == 2


def test_version_and_help_answer_without_importing_torch():
    from importlib.metadata import version

    done = cli("--version", python=("-X", "importtime"))
    assert done.returncode == 0 and done.stdout.strip() == f"whisper-server {version('whisper-server')}"
    assert "torch" not in imported(done)
    for command in ((), ("serve",), ("transcribe",)):
        done = cli(*command, "--help", python=("-X", "importtime"))
        assert done.returncode == 0 and "usage: whisper-server" in done.stdout
        assert "torch" not in imported(done)


def test_a_missing_audio_file_is_found_before_anything_loads(tmp_path):
    done = cli("transcribe", str(tmp_path / "nothere.wav"), python=("-X", "importtime"))
    assert "nothere.wav: no such file" in one_line_error(done)
    assert "torch" not in imported(done)


def test_a_mistyped_model_name_says_what_to_give_instead():
    for command in (("serve",), ("transcribe", str(REPO / "tests" / "data" / JFK))):
        line = one_line_error(cli(*command, "--model", "tiny.eng"))
        assert "unknown model 'tiny.eng'" in line and "did you mean 'tiny.en'" in line and "--model" in line
        assert "tiny.en, base" in line  # the names it knows


def test_a_missing_local_path_is_not_taken_for_a_hub_id():
    line = one_line_error(cli("serve", "--model", "./nodir"))
    assert "'./nodir': no such file or directory" in line and "Repo id" not in line


def test_an_unreachable_hub_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = one_line_error(cli("serve", "--model", "nonexistent-org/whisper-nope"))
    assert "not a local path, a packaged model or in the local Hugging Face cache" in line


def test_translate_on_english_only_model_is_a_usage_error(data_dir):
    done = cli("transcribe", str(data_dir / JFK), "--task", "translate")
    assert done.returncode == 2 and "English-only" in done.stderr
