"""Real servers for end-to-end tests (tests/helpers/server.py's RemoteServer): `python -m server serve` on
127.0.0.1, real weights, real audio.

`data_dir` (tests/data, or WHISPER_TEST_DATA) comes from tests/conftest.py.
"""

from __future__ import annotations

import pytest

from tests.helpers.server import RemoteServer


@pytest.fixture(scope="session")
def server():
    """The default model (tiny.en, English-only)."""
    remote = RemoteServer()
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def base_server():
    """A multilingual model, for translations and language detection."""
    remote = RemoteServer("--model", "base")
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def small_upload_server():
    """Small limits: uploads of 1 MiB, so that oversize uploads are cheap to send; realtime sessions closed after
    2 s without an event."""
    remote = RemoteServer("--max-upload-mb", "1", "--realtime-idle-timeout-s", "2")
    yield remote
    remote.stop()


@pytest.fixture(scope="session")
def process_server():
    """The default model with the engine in a child process (`--engine-process on`, the default on a GPU)."""
    remote = RemoteServer("--engine-process", "on")
    yield remote
    remote.stop()


@pytest.fixture(scope="package")
def diarization_preload_server():
    """The default model with the diarization models loaded at start-up (`--diarization-preload`), for the test of
    that flag and for diarization beside plain requests; stopped after the last end-to-end test."""
    remote = RemoteServer("--diarization-preload")
    yield remote
    remote.stop()


@pytest.fixture
def doomed_process_server():
    """Like process_server, for a test that kills its engine process."""
    remote = RemoteServer("--engine-process", "on")
    yield remote
    remote.stop()
