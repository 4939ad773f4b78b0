"""Images and deployment files, checked offline: hadolint on the worker images, `docker-compose
config` on the compose project, the Kubernetes manifests (as `kubectl kustomize deploy/` builds
them) against Kubernetes' schemas and KEDA's ScaledObject schema, and the names and limits the
farm relies on (farm scale's names, queue list keys, grace periods longer than a chunk)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from farm.config import QueueSettings
from farm.distributed.exporter import redis_list_key
from farm.distributed.scale import compose_services
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KEDA_SCHEMA = ROOT / "tests" / "data" / "keda" / "scaledobject.schema.json"
K8S_VERSION = "1.32.0"
DEVICE_RESOURCE = {"cuda": "nvidia.com/gpu", "ascend": "huawei.com/Ascend910"}


# ---------------------------------------------------------------- images


@pytest.mark.parametrize("target", ["cuda", "ascend"])
def test_worker_image_lints_clean_runs_unprivileged_and_checks_its_health(target):
    hadolint = require_tool("hadolint")
    dockerfile = ROOT / "worker_images" / target / "Dockerfile"
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.strip() for line in dockerfile.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the last USER must not be root"
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert any("farm.observe.health" in line for line in lines)
    for path in ("pyproject.toml", "farm", "tasks"):  # what COPY takes must exist and not be dockerignored
        assert (ROOT / path).exists()
        assert path not in (ROOT / ".dockerignore").read_text().split()


def test_ascend_image_installs_triton_ascend_last_and_sources_cann():
    text = (ROOT / "worker_images/ascend/Dockerfile").read_text()
    assert text.index("torch-npu==") < text.index("pip uninstall -y triton") < text.index("triton-ascend==${")
    assert "set_env.sh" in (ROOT / "worker_images/ascend/entrypoint.sh").read_text()
    assert 'ENTRYPOINT ["farm-entrypoint", "farm"]' in text


# ---------------------------------------------------------------- compose


def compose_config() -> dict:
    tool = require_tool("docker-compose")
    done = subprocess.run([tool, "-f", str(DEPLOY / "compose" / "docker-compose.yml"), "--profile", "ascend", "config"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_project_is_valid_and_complete():
    config = compose_config()
    services = config["services"]
    for name in ("redis", "s3", "s3-init", "prometheus", "grafana", "exporter", "reference-cuda-0"):
        assert name in services, name
    # farm scale --via compose finds one service per device, in order
    path = DEPLOY / "compose" / "docker-compose.yml"
    assert compose_services(path, "search", "cuda") == [f"search-cuda-{d}" for d in range(4)]
    assert compose_services(path, "search", "ascend") == ["search-ascend-0", "search-ascend-1"]
    hard_limit = QueueSettings(chunk_time_limit_s=float(services["search-cuda-0"]["environment"][
        "FARM_QUEUE_CHUNK_TIME_LIMIT_S"])).chunk_hard_limit_s
    for d in range(4):
        svc = services[f"search-cuda-{d}"]
        [device] = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == [str(d)] and device["capabilities"] == ["gpu"]
        assert svc["command"][-2:] == ["--devices", "0"]  # the one GPU the container sees
        assert _seconds(svc["stop_grace_period"]) > hard_limit
    for d in range(2):
        svc = services[f"search-ascend-{d}"]
        assert f"/dev/davinci{d}" in " ".join(str(x) for x in svc["devices"])
        assert svc["environment"]["ASCEND_VISIBLE_DEVICES"] == str(d)
    # Prometheus scrapes every worker service by name, and loads the shared rules
    prom = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    names = prom["scrape_configs"][0]["dns_sd_configs"][0]["names"]
    assert sorted(names) == sorted(n for n in services if n.startswith(("search-", "reference-")))
    mounts = " ".join(str(v) for v in services["prometheus"]["volumes"])
    assert "prometheus/rules" in mounts and "grafana/dashboards" in " ".join(str(v) for v in services["grafana"]["volumes"])


def _seconds(value: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    total, number = 0.0, ""
    for ch in str(value):
        if ch.isdigit() or ch == ".":
            number += ch
        else:
            total += float(number) * units[ch]
            number = ""
    return total + (float(number) if number else 0.0)


# ---------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    kubectl = require_tool("kubectl")
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_manifests_validate_against_the_kubernetes_schemas(manifests):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    jsonschema = pytest.importorskip("jsonschema")
    keda = json.loads(KEDA_SCHEMA.read_text())
    checked = {"k8s": 0, "keda": 0}
    for doc in manifests:
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, keda)
            checked["keda"] += 1
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked["k8s"] += 1
    assert checked["keda"] == 3 and checked["k8s"] >= 20


def test_the_keda_schema_rejects_what_keda_would():
    jsonschema = pytest.importorskip("jsonschema")
    keda = json.loads(KEDA_SCHEMA.read_text())
    bad = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "redis", "metadata": {"listName": "q"}}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, keda)  # no listLength, no address


def _by_kind(manifests: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == kind}


def test_worker_pools_have_devices_grace_and_autoscaling(manifests):
    config = _by_kind(manifests, "ConfigMap")["farm-config"]["data"]
    hard_limit = QueueSettings(chunk_time_limit_s=float(config["FARM_QUEUE_CHUNK_TIME_LIMIT_S"]),
                               visibility_timeout_s=float(config["FARM_QUEUE_VISIBILITY_TIMEOUT_S"])).chunk_hard_limit_s
    deployments = _by_kind(manifests, "Deployment")
    scaled = _by_kind(manifests, "ScaledObject")
    pools = {"farm-reference-cuda": ("reference", "cuda"), "farm-search-cuda": ("search", "cuda"),
             "farm-search-ascend": ("search", "ascend")}
    for name, (pool, target) in pools.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["resources"]["limits"][DEVICE_RESOURCE[target]] == 1
        assert pod["terminationGracePeriodSeconds"] > hard_limit
        assert container["args"] == ["worker", "--pool", pool, "--target", target, "--devices", "0"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert "farm.observe.health" in " ".join(container["livenessProbe"]["exec"]["command"])
        # KEDA: every priority list of the pool's queue, plus queued + running through Prometheus
        so = scaled[name]
        assert so["spec"]["scaleTargetRef"]["name"] == name
        queue = f"{pool}.{target}"
        lists = [t["metadata"]["listName"] for t in so["spec"]["triggers"] if t["type"] == "redis"]
        assert lists == [redis_list_key(queue, p) for p in (0, 3, 6, 9)]
        [prom] = [t for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
        assert f'farm:queue_in_flight:sum{{queue="{queue}"}}' in prom["metadata"]["query"]
        assert "farm:queue_in_flight:sum" in (DEPLOY / "prometheus/rules/farm-rules.yml").read_text()
        assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
            "stabilizationWindowSeconds"] >= 300
    # the control plane: broker, exporter, Prometheus with the rules, Grafana with the dashboards
    assert "redis" in _by_kind(manifests, "StatefulSet")
    for name in ("farm-exporter", "prometheus", "grafana"):
        assert name in deployments
    config_maps = _by_kind(manifests, "ConfigMap")
    assert "farm-rules.yml" in config_maps["farm-prometheus-rules"]["data"]
    assert set(config_maps["farm-grafana-dashboards"]["data"]) == {"fleet.json", "search.json"}
    assert _by_kind(manifests, "Service")["farm-workers"]["spec"]["clusterIP"] == "None"


def test_scale_names_match_the_manifests(manifests):
    from farm.distributed.scale import k8s_commands

    deployments = _by_kind(manifests, "Deployment")
    for pool, target in (("search", "cuda"), ("search", "ascend"), ("reference", "cuda")):
        [cmd] = k8s_commands(pool, target, 3, "farm")
        assert cmd[2].removeprefix("deployment/") in deployments
