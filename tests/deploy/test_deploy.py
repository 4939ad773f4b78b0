"""Images and deployment files, checked offline: hadolint on the worker image, `docker-compose
config` on the compose project, the Kubernetes manifests (as `kubectl kustomize` builds the
standalone layout and the Prometheus Operator overlay) against Kubernetes' schemas and the CRDs'
(KEDA, Prometheus Operator, Security Profiles Operator), Pod Security Standards "restricted",
where credentials come from, network policies, disruption budgets, pinned images, and the names
and limits the farm relies on (farm scale's names, queue list keys, grace periods longer than a
chunk). The seccomp profile itself is tried in tests/deploy/test_security.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from farm.config import QueueSettings
from farm.distributed.exporter import redis_list_key
from farm.distributed.scale import compose_services
from tests.deploy import pss
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KEDA_SCHEMA = ROOT / "tests" / "data" / "keda" / "scaledobject.schema.json"
K8S_VERSION = "1.32.0"
DEVICE_RESOURCE = {"cuda": "nvidia.com/gpu", "ascend": "huawei.com/Ascend910"}


# ---------------------------------------------------------------- images

DOCKERFILE = ROOT / "worker_images" / "Dockerfile"
TARGETS = ("cpu", "cuda", "ascend")


def image_args(target: str) -> dict[str, str]:
    """worker_images/<target>.args: KEY=VALUE lines, what scripts/build-worker-image passes."""
    lines = (ROOT / "worker_images" / f"{target}.args").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_worker_image_lints_clean_runs_unprivileged_and_checks_its_health():
    hadolint = require_tool("hadolint")
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the last USER must not be root"
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert any("farm.observe.health" in line for line in lines)
    ignored = (ROOT / ".dockerignore").read_text().split()
    for line in lines:  # what COPY takes must exist and not be dockerignored
        if line.startswith("COPY "):
            for path in line.split()[1:-1]:
                assert (ROOT / path).exists() and path.split("/")[0] not in ignored, path


def test_every_image_builds_from_the_one_dockerfile_with_its_base_as_a_build_arg():
    text = DOCKERFILE.read_text()
    declared = set(re.findall(r"^ARG (\w+)", text, re.M))
    froms = re.findall(r"^FROM (.+)$", text, re.M)
    assert froms == ["${BASE}"], "FROM must be the build argument BASE"
    assert text.index("ARG BASE") < text.index("FROM ${BASE}")
    for target in TARGETS:
        args = image_args(target)
        assert set(args) <= declared, f"{target}.args sets what the Dockerfile does not declare"
        assert args["BASE"] and "latest" not in args["BASE"] and "TORCH_REQUIREMENT" in args
        if target != "ascend":  # ascend's base: no digest could be checked (its .args says so)
            assert re.search(r"@sha256:[0-9a-f]{64}$", args["BASE"]), f"{target}: base not pinned by digest"
        assert re.fullmatch(r"(\S+==\S+ ?)+", args["TORCH_REQUIREMENT"]), f"{target}: torch not pinned"
    default_base = re.search(r"^ARG BASE=(\S+)", text, re.M).group(1)
    assert default_base == image_args("cuda")["BASE"]  # plain `docker build` is the cuda image


def test_python_dependencies_of_the_images_are_pinned():
    text = DOCKERFILE.read_text()
    pins = [line for line in (ROOT / "worker_images/constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][^ ]*", line) for line in pins), pins
    names = {line.split("==")[0].lower().replace("_", "-") for line in pins}
    assert {"celery", "kombu", "redis", "boto3", "typer", "prometheus-client", "nvidia-ml-py"} <= names
    assert not names & {"torch", "triton"}, "torch and triton are pinned per image, in its .args"
    installs = re.findall(r"pip install ([^&\n]+)", text)
    assert installs and all("-c /opt/farm/constraints.txt" in line for line in installs
                            if "triton-ascend" not in line), installs


def test_ascend_image_installs_triton_ascend_last_and_sources_cann():
    text = DOCKERFILE.read_text()
    args = image_args("ascend")
    assert args["EXTRA_REQUIREMENTS"].startswith("torch-npu==") and args["TRITON_ASCEND_VERSION"]
    assert text.index("${EXTRA_REQUIREMENTS}") < text.index("pip uninstall -y triton") < text.index(
        "triton-ascend==${TRITON_ASCEND_VERSION}")
    assert "set_env.sh" in (ROOT / "worker_images/entrypoint.sh").read_text()
    assert 'ENTRYPOINT ["farm-entrypoint", "farm"]' in text


# ---------------------------------------------------------------- compose


COMPOSE_SECRETS = {"REDIS_PASSWORD": "redis-test-password", "GRAFANA_ADMIN_PASSWORD": "grafana-test-password"}


def compose_config(**env: str) -> subprocess.CompletedProcess:
    """`docker-compose config` from the repository root, where the compose file's seccomp path
    is resolved (docs/operations.md)."""
    tool = require_tool("docker-compose")
    base = {k: v for k, v in os.environ.items() if k not in COMPOSE_SECRETS}
    return subprocess.run([tool, "-f", str(DEPLOY / "compose" / "docker-compose.yml"), "--profile", "ascend", "config"],
                          capture_output=True, text=True, cwd=ROOT, env={**base, **env})


def compose_file_services() -> dict:
    done = compose_config(**COMPOSE_SECRETS)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]


def test_compose_project_is_valid_and_complete():
    services = compose_file_services()
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


def test_compose_confines_every_farm_container_and_takes_credentials_from_the_environment():
    services = compose_file_services()
    text = (DEPLOY / "compose" / "docker-compose.yml").read_text()
    assert "unconfined" not in text
    for name, svc in services.items():
        assert not str(svc.get("image", "")).endswith(":latest"), name
        if name.startswith(("search-", "reference-", "exporter")):
            assert svc["read_only"] and svc["cap_drop"] == ["ALL"], name
            assert "/home/farm" in " ".join(svc["tmpfs"]), name
            opts = [o.replace(":", "=", 1) for o in svc["security_opt"]]
            assert "no-new-privileges=true" in opts, name
        if name.startswith("search-"):  # bubblewrap's calls, through the project's profile only
            [profile] = [o.split("=", 1)[1] for o in opts if o.startswith("seccomp=")]
            assert (ROOT / profile).resolve() == (DEPLOY / "security" / "farm-bwrap.json").resolve(), name
    build = services["search-ascend-0"]["build"]["args"]
    assert build == image_args("ascend"), "compose's ascend build args drift from worker_images/ascend.args"
    assert "redis-test-password" in services["redis"]["command"]
    assert "redis-test-password" in services["search-cuda-0"]["environment"]["FARM_QUEUE_BROKER_URL"]
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "grafana-test-password"
    for missing in COMPOSE_SECRETS:  # no default password: compose refuses to start without one
        done = compose_config(**{k: v for k, v in COMPOSE_SECRETS.items() if k != missing})
        assert done.returncode != 0 and missing in done.stderr, missing


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

CRD_SCHEMAS = {"ScaledObject": KEDA_SCHEMA} | {
    kind: ROOT / "tests" / "data" / "crds" / f"{kind.lower()}.schema.json"
    for kind in ("TriggerAuthentication", "PodMonitor", "ServiceMonitor", "PrometheusRule", "SeccompProfile")}
WORKER_POOLS = ("farm-reference-cuda", "farm-search-cuda", "farm-search-ascend")
SECRETS = {"farm-s3": None, "farm-redis": {"password"}, "farm-grafana": {"admin-user", "admin-password"}}
PROFILE = DEPLOY / "security" / "farm-bwrap.json"


def kustomize(path: Path) -> list[dict]:
    kubectl = require_tool("kubectl")
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def manifests() -> list[dict]:
    return kustomize(DEPLOY)


@pytest.fixture(scope="module")
def operator_manifests(tmp_path_factory) -> list[dict]:
    """The Prometheus Operator overlay with the Security Profiles Operator component, as a
    cluster running both would apply them."""
    folder = tmp_path_factory.mktemp("overlay")
    rel = os.path.relpath(DEPLOY, folder)  # kustomize takes no absolute paths here
    (folder / "kustomization.yaml").write_text(f"resources: [{rel}/overlays/prometheus-operator]\n"
                                               f"components: [{rel}/components/security-profiles-operator]\n")
    return kustomize(folder)


def validate(docs: list[dict]) -> dict[str, int]:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    jsonschema = pytest.importorskip("jsonschema")
    checked: dict[str, int] = {}
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.validate(doc, json.loads(CRD_SCHEMAS[doc["kind"]].read_text()))
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked[doc["kind"]] = checked.get(doc["kind"], 0) + 1
    return checked


def test_manifests_validate_against_the_kubernetes_schemas(manifests, operator_manifests):
    checked = validate(manifests)
    assert checked["ScaledObject"] == 3 and checked["TriggerAuthentication"] == 1 and sum(checked.values()) >= 30
    checked = validate(operator_manifests)
    assert {checked[k] for k in ("PodMonitor", "ServiceMonitor", "PrometheusRule", "SeccompProfile")} == {1}


def test_the_crd_schemas_reject_what_the_api_server_would():
    jsonschema = pytest.importorskip("jsonschema")
    keda = json.loads(KEDA_SCHEMA.read_text())
    bad = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "redis", "metadata": {"listName": "q"}}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, keda)  # no listLength, no address
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "r", "namespace": "farm"},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "record": "b", "expr": "1"}]}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, json.loads(CRD_SCHEMAS["PrometheusRule"].read_text()))  # alert and record at once


def _by_kind(manifests: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == kind}


def _containers(template: dict) -> list[dict]:
    return template["spec"].get("initContainers", []) + template["spec"]["containers"]


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


def test_every_pod_meets_pod_security_restricted_and_the_namespace_enforces_it(manifests, operator_manifests):
    for docs in (manifests, operator_manifests):
        templates = pss.pod_templates(docs)
        assert len(templates) >= 5
        for name, template in templates.items():
            assert not pss.restricted(template), (name, pss.restricted(template))
    labels = _by_kind(manifests, "Namespace")["farm"]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_pod_security_check_refuses_what_admission_would():
    ok = {"metadata": {}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}
    assert pss.restricted(ok) == []

    def variant(path: str, value) -> dict:
        doc = json.loads(json.dumps(ok))
        *parents, leaf = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[leaf] = value
        return doc

    assert pss.baseline(variant("spec.securityContext.seccompProfile", {"type": "Unconfined"}))
    assert pss.baseline(variant("spec.containers.0.securityContext.seccompProfile", {"type": "Unconfined"}))
    assert pss.baseline(variant("spec.containers.0.securityContext.privileged", True))
    assert pss.baseline(variant("spec.hostPID", True))
    assert pss.baseline(variant("spec.volumes", [{"name": "h", "hostPath": {"path": "/"}}]))
    assert pss.baseline(variant("spec.containers.0.securityContext.capabilities.add", ["SYS_ADMIN"]))
    assert not pss.baseline(variant("spec.containers.0.securityContext.capabilities.drop", []))
    assert pss.restricted(variant("spec.containers.0.securityContext.capabilities.drop", []))
    assert pss.restricted(variant("spec.containers.0.securityContext.allowPrivilegeEscalation", True))
    assert pss.restricted(variant("spec.securityContext.seccompProfile", None))
    assert pss.restricted(variant("spec.securityContext.runAsNonRoot", False))


def test_search_pods_allow_bubblewrap_through_the_farm_profile_and_nothing_runs_unconfined(manifests, operator_manifests):
    for docs, path in ((manifests, "farm/farm-bwrap.json"), (operator_manifests, "operator/farm/farm-bwrap.json")):
        for name, template in pss.pod_templates(docs).items():
            seccomp = template["spec"]["securityContext"]["seccompProfile"]
            if "farm-search-" in name:
                assert seccomp == {"type": "Localhost", "localhostProfile": path}, name
            else:
                assert seccomp == {"type": "RuntimeDefault"}, name
    assert "Unconfined" not in (DEPLOY / "k8s" / "workers.yaml").read_text()
    [spo] = [d for d in operator_manifests if d["kind"] == "SeccompProfile"]
    assert spo["metadata"] == {**spo["metadata"], "name": "farm-bwrap", "namespace": "farm"}
    assert spo["spec"] == json.loads(PROFILE.read_text())  # one profile, two ways onto the nodes


def test_credentials_come_from_secrets_that_the_manifests_never_hold(manifests):
    assert not _by_kind(manifests, "Secret"), "a Secret with a value in the repository"
    for name, template in pss.pod_templates(manifests).items():
        for container in _containers(template):
            for ref in container.get("envFrom", []):
                if "secretRef" in ref:
                    assert ref["secretRef"]["name"] in SECRETS, name
            env = {e["name"]: e for e in container.get("env", [])}
            for var in env.values():
                key_ref = var.get("valueFrom", {}).get("secretKeyRef")
                if key_ref:
                    assert key_ref["key"] in (SECRETS[key_ref["name"]] or ()), (name, var["name"])
                assert not re.search(r"(PASSWORD|SECRET|TOKEN)", var["name"]) or "valueFrom" in var or \
                    var["value"].startswith("$("), (name, var["name"])
            if "FARM_QUEUE_BROKER_URL" in env:
                assert env["FARM_QUEUE_BROKER_URL"]["value"].startswith("redis://:$(REDIS_PASSWORD)@"), name
                assert list(env).index("REDIS_PASSWORD") < list(env).index("FARM_QUEUE_BROKER_URL")
    redis = _by_kind(manifests, "StatefulSet")["redis"]["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][redis["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    grafana = _by_kind(manifests, "Deployment")["grafana"]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"] for e in grafana["env"] if "valueFrom" in e} >= {"GF_SECURITY_ADMIN_USER",
                                                                       "GF_SECURITY_ADMIN_PASSWORD"}
    auth = _by_kind(manifests, "TriggerAuthentication")
    [ref] = auth["farm-redis"]["spec"]["secretTargetRef"]
    assert ref == {"parameter": "password", "name": "farm-redis", "key": "password"}
    for so in _by_kind(manifests, "ScaledObject").values():
        for trigger in so["spec"]["triggers"]:
            if trigger["type"] == "redis":
                assert trigger["authenticationRef"]["name"] in auth
    documented = (ROOT / "docs" / "operations.md").read_text()
    for secret in SECRETS:
        assert f"create secret generic {secret}" in documented, secret


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        (labels.get(e["key"]) in e["values"]) == (e["operator"] == "In")
        for e in selector.get("matchExpressions", []))


def test_each_pool_has_its_network_policy_and_disruption_budget_and_the_rest_is_denied(manifests):
    policies = _by_kind(manifests, "NetworkPolicy")
    deny = policies["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    budgets = _by_kind(manifests, "PodDisruptionBudget")
    for name, template in pss.pod_templates(manifests).items():
        labels = template["metadata"]["labels"]
        own = [p for p, doc in policies.items() if doc["spec"]["podSelector"] and _selects(doc["spec"]["podSelector"], labels)]
        assert own, f"{name}: no network policy of its own"
        if name.removeprefix("Deployment/") in WORKER_POOLS:
            assert name.removeprefix("Deployment/") in own
            [pdb] = [b for b in budgets.values() if _selects(b["spec"]["selector"], labels)]
            assert pdb["spec"]["maxUnavailable"] == 1, name
    # what the workers need: Redis, the store; Redis admits only the farm's pods and KEDA
    for pool in WORKER_POOLS:
        egress_ports = {p["port"] for rule in policies[pool]["spec"]["egress"] for p in rule["ports"]}
        assert {6379, 443} <= egress_ports, pool
    ingress = policies["redis"]["spec"]["ingress"]
    assert [p["port"] for rule in ingress for p in rule["ports"]] == [6379]


def test_every_container_has_a_read_only_root_and_pinned_images(manifests, operator_manifests):
    for docs in (manifests, operator_manifests):
        for name, template in pss.pod_templates(docs).items():
            for container in _containers(template):
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
                image = container["image"]
                assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
                if not image.startswith("kernel-farm/"):  # the farm's own: pinned at push (docs/operations.md)
                    assert re.search(r"@sha256:[0-9a-f]{64}$", image), image
                mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
                if image.startswith("kernel-farm/"):  # where the farm writes: HOME and /tmp
                    assert {"/tmp", "/home/farm"} <= mounts, name


def test_the_operator_overlay_monitors_with_the_standalone_rules_and_dashboards(operator_manifests, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "render-deploy"), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    kinds = {d["kind"] for d in operator_manifests}
    assert {"PodMonitor", "ServiceMonitor", "PrometheusRule"} <= kinds
    deployments = _by_kind(operator_manifests, "Deployment")
    assert "prometheus" not in deployments and "grafana" not in deployments
    [rule] = _by_kind(operator_manifests, "PrometheusRule").values()
    assert rule["spec"]["groups"] == yaml.safe_load((DEPLOY / "prometheus/rules/farm-rules.yml").read_text())["groups"]
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    [pod_monitor] = _by_kind(operator_manifests, "PodMonitor").values()
    [endpoint] = pod_monitor["spec"]["podMetricsEndpoints"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "farm-workers"} in endpoint["relabelings"]
    [service_monitor] = _by_kind(operator_manifests, "ServiceMonitor").values()
    services = _by_kind(operator_manifests, "Service")
    assert _selects(service_monitor["spec"]["selector"], services["farm-exporter"]["metadata"]["labels"])
    dashboards = _by_kind(operator_manifests, "ConfigMap")["farm-grafana-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    for so in _by_kind(operator_manifests, "ScaledObject").values():
        [prom] = [t for t in so["spec"]["triggers"] if t["type"] == "prometheus"]
        assert "prometheus.farm.svc" not in prom["metadata"]["serverAddress"]  # the standalone one is not there


def test_alerts_are_critical_or_warning_with_a_runbook_section(manifests):
    rules = yaml.safe_load((DEPLOY / "prometheus/rules/farm-rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    docs = (ROOT / "docs" / "operations.md").read_text()
    anchors = {_anchor(line.lstrip("#")) for line in docs.splitlines() if line.startswith("#")}
    assert alerts
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("{{ or $externalLabels.farm_runbook_base \"docs/operations.md\" }}#"), url
        assert url.rsplit("#", 1)[1] in anchors, f"{alert['alert']}: no section {url} in docs/operations.md"


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_scale_names_match_the_manifests(manifests):
    from farm.distributed.scale import k8s_commands

    deployments = _by_kind(manifests, "Deployment")
    for pool, target in (("search", "cuda"), ("search", "ascend"), ("reference", "cuda")):
        [cmd] = k8s_commands(pool, target, 3, "farm")
        assert cmd[2].removeprefix("deployment/") in deployments
