"""API keys: where they come from, how they are compared, which paths they guard (through the real app)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.datastructures import Headers

from server.app import create_app
from server.auth import KeyChecker, bearer_key
from server.settings import Settings
from tests.helpers.fake_engine import FakeEngine


def test_keys_from_flags_environment_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WHISPER_API_KEY", "env-one, env-two ,")
    assert Settings().api_keys() == ["env-one", "env-two"]
    key_file = tmp_path / "keys"
    key_file.write_text("# comment\nfile-one\n\n  file-two  \n")
    settings = Settings(api_key=["flag"], api_key_file=key_file)
    assert settings.api_keys() == ["flag", "file-one", "file-two"]


def test_checker_accepts_exactly_the_keys():
    checker = KeyChecker(["alpha-key", "beta-key"])
    assert checker.accepts("alpha-key") and checker.accepts("beta-key")
    for wrong in ("alpha-ke", "alpha-key ", "ALPHA-KEY", "", "beta-keyx"):
        assert not checker.accepts(wrong)


@pytest.mark.parametrize(
    "header, key",
    [(None, None), ("Bearer k1", "k1"), ("bearer   k2 ", "k2"), ("Basic k3", None), ("Bearer", None), ("k4", None)],
)
def test_bearer_key(header, key):
    headers = Headers({"authorization": header} if header is not None else {})
    assert bearer_key(headers) == key


def test_protected_and_open_paths():
    async def body() -> dict[str, int]:
        app = create_app(Settings(api_key=["k"]), engine=FakeEngine())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            paths = ["/v1/models", "/v1/models/whisper-1", "/v1", "/v1/other", "/health", "/metrics", "/docs"]
            return {p: (await client.get(p)).status_code for p in paths}

    codes = asyncio.run(body())
    assert codes == {
        "/v1/models": 401, "/v1/models/whisper-1": 401, "/v1": 401, "/v1/other": 401,
        "/health": 200, "/metrics": 200, "/docs": 200,
    }  # fmt: skip
