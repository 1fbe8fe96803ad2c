"""deploy/: the Kubernetes manifests render (kubectl kustomize) and are valid Kubernetes objects
(kubernetes-validate, strict: no unknown fields), the compose file is valid (docker compose / docker-compose
config), and both ask of the server only what it has: its settings' environment variables, its probes' routes,
the metric the autoscaler reads and every metric the Grafana dashboard queries."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from server.metrics import Metrics
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("gpu", "cpu")
KUBERNETES_VERSION = "1.32"
DRAIN_ENGINE_STOP_S = 3  # the engine process's stop after the drain (engine/engine_process.py)


def settings_env() -> set[str]:
    return {f"WHISPER_{name.upper()}" for name in Settings.model_fields}


def exported_metrics() -> set[str]:
    """Every sample name /metrics can carry, labelled or not yet observed."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",)}  # fmt: skip
    return {family.name + s for family in Metrics().registry.collect() for s in suffixes[family.type]}


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (for kustomize) is not installed")
    out = subprocess.run([kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict]) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in docs}


def test_every_base_manifest_is_a_valid_kubernetes_object():
    import kubernetes_validate

    files = [p for p in sorted((KUBERNETES / "base").glob("*.yaml")) if p.name != "kustomization.yaml"]
    assert len(files) == 5
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_valid_objects_for_the_server(overlay):
    import kubernetes_validate

    docs = render(overlay)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    kinds = by_kind(docs)
    assert set(kinds) == {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                          "PersistentVolumeClaim"}  # fmt: skip
    deployment = kinds["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # the server's own command, its settings, and routes it has
    assert container["command"] == ["whisper-server"] and container["args"][0] == "serve"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {n for n in env if n.startswith("WHISPER_")} <= settings_env(), set(env) - settings_env()
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    # the grace period covers preStop, the whole drain and the engine's stop
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(env["WHISPER_DRAIN_TIMEOUT_S"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + DRAIN_ENGINE_STOP_S
    # the API keys from a Secret, mounted where WHISPER_API_KEY_FILE points
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert env["WHISPER_API_KEY_FILE"].startswith(mounts["api-keys"] + "/")
    assert volumes["api-keys"]["secret"]["secretName"]
    assert env["HF_HOME"] == mounts["model-cache"]
    assert (
        volumes["model-cache"]["persistentVolumeClaim"]["claimName"]
        == kinds["PersistentVolumeClaim"]["metadata"]["name"]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] and mounts["tmp"] == "/tmp"
    assert pod["securityContext"]["runAsNonRoot"]
    # the autoscaler reads a gauge the server exports
    (metric,) = kinds["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] in exported_metrics()
    resources = container["resources"]
    if overlay == "gpu":
        assert container["image"] == "whisper-server:gpu" and env["WHISPER_DEVICE"] == "cuda"
        assert resources["limits"]["nvidia.com/gpu"] == 1 and pod["nodeSelector"]
    else:
        assert container["image"] == "whisper-server:cpu" and env["WHISPER_DEVICE"] == "cpu"
        assert resources["limits"]["cpu"] == resources["requests"]["cpu"]  # the quota torch's threads follow


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], check=False, capture_output=True).returncode == 0:
        return [docker, "compose"]
    pytest.skip("neither docker compose nor docker-compose is installed")


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_compose_file_is_valid_and_scraped(profile):
    cmd = compose_command()
    out = subprocess.run([*cmd, "-f", str(ROOT / "deploy" / "compose.yaml"), "--profile", profile, "config"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    services = config["services"]
    server = services[f"whisper-{profile}"]
    assert {"prometheus", "grafana"} <= set(services) and profile in server["profiles"]
    env = server["environment"]
    assert {n for n in env if n.startswith("WHISPER_")} <= settings_env()
    assert "whisper-server" in server["networks"]["default"]["aliases"]
    grace = int(re.fullmatch(r"(\d+)s", str(server["stop_grace_period"])).group(1))
    assert grace > float(env["WHISPER_DRAIN_TIMEOUT_S"]) + DRAIN_ENGINE_STOP_S
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"] == ["whisper-server:8000"]


def test_the_dashboard_queries_only_metrics_the_server_exports():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "whisper-server.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 8
    names = {m for e in exprs for m in re.findall(r"\bwhisper_[a-z_]+", e)}
    assert names and names <= exported_metrics(), names - exported_metrics()
    # what the issue asks to see: requests, latency, queue, running, TTFT, RTFx (audio seconds), graph replays
    for needed in ("whisper_http_requests_total", "whisper_http_request_duration_seconds_bucket",
                   "whisper_queue_depth", "whisper_running_sequences", "whisper_time_to_first_token_seconds_bucket",
                   "whisper_audio_seconds_total", "whisper_engine_total"):  # fmt: skip
        assert needed in names, needed
    provider = yaml.safe_load(
        (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "whisper-server.yaml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
