"""The Helm chart: lint, render with default and full values, validate the manifests offline, refuse bad
values, and start a real gateway from the configuration the chart renders."""

from __future__ import annotations

import ast
import base64
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import openai
import pytest
import yaml
from helm_tool import helm_binary
from hosted_gateway import PYTHON_TOOL, python_rule
from live_gateway import GatewayProcess
from paths import CHART
from redis_servers import free_port
from unprivileged import unprivileged_gateway, write_readable

FULL_VALUES = CHART / "ci" / "full-values.yaml"
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")  # the oldest and newest schemas this chart is checked against
CRDS = {"ServiceMonitor", "PrometheusRule"}  # not in the Kubernetes schemas; checked by hand below


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def _helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def _render(helm: str, *args: str) -> dict[str, dict]:
    """`helm template` output by `Kind/name`."""
    done = _helm(helm, "template", "gw", str(CHART), "--namespace", "ai", *args)
    assert done.returncode == 0, done.stderr
    documents = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in documents}


@pytest.fixture(scope="module")
def default_manifests(helm):
    return _render(helm)


@pytest.fixture(scope="module")
def full_manifests(helm):
    return _render(helm, "-f", str(FULL_VALUES))


@pytest.mark.parametrize("values", [[], ["-f", str(FULL_VALUES)]], ids=["default", "full"])
def test_lint_passes_strictly(helm, values):
    done = _helm(helm, "lint", "--strict", str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr


def test_default_values_render_a_single_secure_replica(default_manifests):
    assert sorted(default_manifests) == [
        "ConfigMap/gw-gpt-oss-gateway",
        "ConfigMap/gw-gpt-oss-gateway-dashboard",
        "Deployment/gw-gpt-oss-gateway",
        "PodDisruptionBudget/gw-gpt-oss-gateway",
        "Secret/gw-gpt-oss-gateway",
        "Service/gw-gpt-oss-gateway",
        "Service/gw-gpt-oss-gateway-metrics",
        "ServiceAccount/gw-gpt-oss-gateway",
    ]
    pod = default_manifests["Deployment/gw-gpt-oss-gateway"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["image"] == "ghcr.io/gpt-oss-gateway/gpt-oss-gateway:0.1.0"
    config = default_manifests["ConfigMap/gw-gpt-oss-gateway"]["data"]
    assert config["GATEWAY_AUTH"] == "keys" and "GATEWAY_METRICS_PUBLIC" not in config
    api_ports = default_manifests["Service/gw-gpt-oss-gateway"]["spec"]["ports"]
    assert [port["name"] for port in api_ports] == ["http"]  # /metrics is not on the API Service
    dashboard = default_manifests["ConfigMap/gw-gpt-oss-gateway-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "gpt-oss-gateway.json").read_text())
    assert json.loads(dashboard["data"]["gpt-oss-gateway.json"]) == shipped


def test_full_values_render_every_part(full_manifests):
    kinds = sorted({key.split("/")[0] for key in full_manifests})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Ingress",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Secret",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    pod = full_manifests["Deployment/gw-gpt-oss-gateway"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = full_manifests["ConfigMap/gw-gpt-oss-gateway"]["data"]
    assert pod["terminationGracePeriodSeconds"] == 10 + 120 + 10  # preStop pause + drain budget + last events
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert config["GATEWAY_DRAIN_S"] == "120"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true" and pod["runtimeClassName"] == "nvidia"
    assert {t["key"] for t in pod["tolerations"]} == {"dedicated", "nvidia.com/gpu"}
    assert json.loads(config["GATEWAY_BACKENDS"])["big"]["options"]["retries"] == 2
    monitor = full_manifests["ServiceMonitor/gw-gpt-oss-gateway"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    metrics_service = full_manifests["Service/gw-gpt-oss-gateway-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    rule = full_manifests["PrometheusRule/gw-gpt-oss-gateway"]
    shipped_rules = yaml.safe_load((CHART / "alerts" / "gpt-oss-gateway.rules.yaml").read_text())
    assert rule["spec"] == shipped_rules and rule["metadata"]["labels"]["release"] == "prometheus"
    hpa = full_manifests["HorizontalPodAutoscaler/gw-gpt-oss-gateway"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 12) and "replicas" not in pod
    redis_url = base64.b64decode(full_manifests["Secret/gw-gpt-oss-gateway-redis"]["data"]["redis-url"]).decode()
    assert redis_url.startswith("rediss://") and redis_url not in json.dumps(config)  # the URL holds a password


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_manifests_validate_against_the_kubernetes_schemas(default_manifests, full_manifests, version):
    checked = 0
    for manifests in (default_manifests, full_manifests):
        for key, document in manifests.items():
            if document["kind"] in CRDS:
                continue
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{key} is not valid Kubernetes {version}: {error.message} at {list(error.path)}")
            checked += 1
    assert checked >= 15


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["--set", "auth.mode=open"], "auth.mode"),
        (["--set", "redis.url=http://redis:6379"], "redis.url"),
        (["--set", "auth.keySecret=short"], "auth.keySecret"),
        (["--set", "replicaCount=3"], "more than one replica needs redis.url"),
        (["--set", "autoscaling.enabled=true"], "more than one replica needs redis.url"),
        (["--set", "drain.seconds=-1"], "drain.seconds"),
        (["--set", "modelVolume.enabled=true"], "existingClaim"),
        (["--set", "gateway.unknown=1"], "unknown"),
    ],
)
def test_bad_values_are_refused_with_the_reason(helm, values, complaint):
    done = _helm(helm, "template", "gw", str(CHART), *values)
    assert done.returncode != 0 and complaint in done.stderr, done.stderr


def _gateway_env(manifests: dict[str, dict], tmp_path: Path, redis_url: str | None) -> dict[str, str]:
    """The environment the chart gives the container, with paths and addresses mapped onto this machine."""
    pod = manifests["Deployment/gw-gpt-oss-gateway"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = dict(manifests[f"ConfigMap/{container['envFrom'][0]['configMapRef']['name']}"]["data"])
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        secret = manifests[f"Secret/{ref['name']}"]["data"]
        env[entry["name"]] = base64.b64decode(secret[ref["key"]]).decode()
    keys_volume = next(volume for volume in pod["volumes"] if volume["name"] == "keys")
    keys_secret = manifests[f"Secret/{keys_volume['secret']['secretName']}"]["data"]["keys.json"]
    keys_file = tmp_path / "keys.json"
    keys_file.write_bytes(base64.b64decode(keys_secret))
    env.update(GATEWAY_HOST="127.0.0.1", GATEWAY_KEYS_FILE=str(keys_file), GATEWAY_METRICS_PORT=str(free_port()))
    env.pop("HOME")
    if redis_url is not None:
        env["GATEWAY_REDIS_URL"] = redis_url
    return env


@pytest.mark.parametrize("values", ["default", "full"])
def test_the_rendered_configuration_starts_a_working_gateway(
    values, default_manifests, full_manifests, tmp_path, request
):
    manifests = default_manifests if values == "default" else full_manifests
    redis_url = request.getfixturevalue("redis_server").url if values == "full" else None
    env = _gateway_env(manifests, tmp_path, redis_url)
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()  # start() waits for /readyz to answer 200
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{env['GATEWAY_METRICS_PORT']}/metrics", timeout=5) as scrape:
            assert b"gateway_requests_total" in scrape.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(gateway.url + "/v1/models", timeout=5)
        assert refused.value.code == 401  # keys are on, and the chart's default keys file holds none
    finally:
        gateway.stop()


def test_gpu_mode_runs_the_built_in_engine_on_cuda_unless_told_otherwise(helm):
    single = _render(helm, "--set", "gpu.enabled=true", "--set", "gateway.backend.kind=onnx")
    options = json.loads(single["ConfigMap/gw-gpt-oss-gateway"]["data"]["GATEWAY_BACKEND_OPTIONS"])
    assert options == {"device": "cuda"}
    pinned = _render(
        helm, "--set", "gpu.enabled=true", "--set", "gateway.backend.kind=onnx",
        "--set", "gateway.backend.options.device=cpu",
    )  # fmt: skip
    assert json.loads(pinned["ConfigMap/gw-gpt-oss-gateway"]["data"]["GATEWAY_BACKEND_OPTIONS"])["device"] == "cpu"
    several = _render(
        helm, "--set", "gpu.enabled=true", "--set-json",
        'gateway.backends={"local": {"kind": "onnx", "models": ["gpt-oss-20b"]}, '
        '"far": {"kind": "vllm", "options": {"urls": ["http://v:8000"]}, "models": ["gpt-oss-120b"]}}',
    )  # fmt: skip
    backends = json.loads(several["ConfigMap/gw-gpt-oss-gateway"]["data"]["GATEWAY_BACKENDS"])
    assert backends["local"]["options"] == {"device": "cuda"} and "device" not in backends["far"]["options"]
    cpu_only = _render(helm, "--set", "gateway.backend.kind=onnx")
    assert "GATEWAY_BACKEND_OPTIONS" not in cpu_only["ConfigMap/gw-gpt-oss-gateway"]["data"]


# as values.yaml says for its 1Gi pod without a cgroup: memory_mb x processes x max_sandboxes within half of it
PYTHON_VALUES = (
    '{"python": {"enabled": true, "wall_s": 5, "python": "/usr/bin/python3",'
    ' "memory_mb": 128, "processes": 4, "max_sandboxes": 1, "memory_budget_mb": 512}}'
)


def test_the_python_sandbox_gets_user_namespaces_and_nothing_more(helm, default_manifests):
    """With python on (strict isolation), the gateway container runs without the runtime's seccomp and AppArmor
    profiles, which forbid user namespaces, and keeps the rest: non-root, no capabilities, no escalation; with
    python off, or 'weak', the defaults stay."""
    manifests = _render(helm, "--set-json", f"hostedTools={PYTHON_VALUES}")
    template = manifests["Deployment/gw-gpt-oss-gateway"]["spec"]["template"]
    container = template["spec"]["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "Unconfined"},
    }
    assert template["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/gateway"] == "unconfined"
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    hosted = json.loads(manifests["ConfigMap/gw-gpt-oss-gateway"]["data"]["GATEWAY_HOSTED_TOOLS"])
    assert hosted["python"]["enabled"] is True
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(manifests["Deployment/gw-gpt-oss-gateway"], version, strict=True)
    weak = _render(helm, "--set-json", 'hostedTools={"python": {"enabled": true, "isolation": "weak"}}')
    for rendered in (default_manifests, weak):
        template = rendered["Deployment/gw-gpt-oss-gateway"]["spec"]["template"]
        assert "seccompProfile" not in template["spec"]["containers"][0]["securityContext"]
        assert not any("apparmor" in key for key in template["metadata"]["annotations"])
    assert "GATEWAY_HOSTED_TOOLS" not in default_manifests["ConfigMap/gw-gpt-oss-gateway"]["data"]


def test_the_rendered_python_sandbox_runs_isolated_as_the_pods_uid(helm, shared_dir):
    """The chart's configuration with python on, run as the pod's uid 10001: a cell sees uid 1000 of its own
    user namespace, its own processes only, none of the host's files, and runs under seccomp."""
    manifests = _render(helm, "--set-json", f"hostedTools={PYTHON_VALUES}")
    env = _gateway_env(manifests, shared_dir, None)
    for name in ("GATEWAY_AUTH", "GATEWAY_KEYS_FILE", "GATEWAY_KEY_SECRET"):  # the chart's key file holds no keys
        env.pop(name, None)
    look = (
        "import os\n"
        "status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "(os.getuid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2], os.path.exists('/work'),"
        " status['Seccomp'])"
    )
    script = {"rules": [{"match": {"tool": "."}, "emit": [{"final": "Noted."}]}, python_rule("look", look)]}
    env["GATEWAY_MOCK_SCRIPT"] = str(write_readable(shared_dir / "script.json", script))
    gateway = unprivileged_gateway(shared_dir, env).start()
    try:
        api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        response = api.responses.create(model="gpt-oss-120b", input="look", tools=[PYTHON_TOOL])
        (call,) = [item for item in response.output if item.type == "code_interpreter_call"]
        assert ast.literal_eval(call.outputs[0].logs.strip()) == (1000, [1, 2], False, "2")
    finally:
        gateway.stop()


ENGINE_VALUES = (
    "--set", "engine.enabled=true", "--set", "gpu.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "modelVolume.enabled=true", "--set", "modelVolume.existingClaim=weights",
    "--set-json", 'engine.options={"checkpoint": "/models/gpt-oss-20b", "max_positions": 32768, "max_batch": 64}',
)  # fmt: skip


def _selected(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_engine_tier_renders_gpu_engine_pods_by_name_and_a_cpu_api_tier_that_lists_them(helm):
    manifests = _render(helm, *ENGINE_VALUES)
    engine = manifests["StatefulSet/gw-gpt-oss-gateway-engine"]
    service = manifests["Service/gw-gpt-oss-gateway-engine"]
    assert service["spec"]["clusterIP"] == "None" and engine["spec"]["serviceName"] == service["metadata"]["name"]
    pod = engine["spec"]["template"]
    assert _selected(service["spec"]["selector"], pod["metadata"]["labels"])
    api = manifests["Deployment/gw-gpt-oss-gateway"]
    for selector in (
        api["spec"]["selector"]["matchLabels"],
        manifests["Service/gw-gpt-oss-gateway"]["spec"]["selector"],
        manifests["PodDisruptionBudget/gw-gpt-oss-gateway"]["spec"]["selector"]["matchLabels"],
    ):
        assert not _selected(selector, pod["metadata"]["labels"])  # the API tier never takes engine pods in
    container = pod["spec"]["containers"][0]
    assert container["args"] == ["serve-engine"] and container["image"].endswith("-cuda")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # ready once the model is loaded
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/models", "/var/cache/gpt-oss-gateway"}
    env = {e["name"]: e for e in container["env"]}
    options = json.loads(env["GATEWAY_ENGINE_OPTIONS"]["value"])
    assert options["device"] == "cuda" and options["max_batch"] == 64 and options["cache_dir"]
    assert env["GATEWAY_ENGINE_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "engine-key"

    api_pod = api["spec"]["template"]["spec"]
    api_container = api_pod["containers"][0]
    assert "nvidia.com/gpu" not in api_container["resources"].get("limits", {}) and "nodeSelector" not in api_pod
    assert not api_container["image"].endswith("-cuda")
    config = manifests["ConfigMap/gw-gpt-oss-gateway"]["data"]
    assert config["GATEWAY_BACKEND"] == "engine"
    assert config["GATEWAY_BACKEND_URLS"].split(",") == [
        f"http://gw-gpt-oss-gateway-engine-{i}.gw-gpt-oss-gateway-engine.ai.svc:8100" for i in range(2)
    ]
    assert json.loads(config["GATEWAY_BACKEND_OPTIONS"]) == {"context_length": 32768, "api_key_env": "ENGINE_API_KEY"}
    api_env = {e["name"]: e for e in api_container["env"]}
    assert api_env["ENGINE_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "engine-key"
    assert len(base64.b64decode(manifests["Secret/gw-gpt-oss-gateway"]["data"]["engine-key"])) >= 32
    monitor = manifests["ServiceMonitor/gw-gpt-oss-gateway-engine"]
    assert _selected(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    for version in KUBERNETES_VERSIONS:
        for document in manifests.values():
            if document["kind"] not in CRDS:
                kubernetes_validate.validate(document, version, strict=True)
    refused = _helm(helm, "template", "gw", str(CHART), *ENGINE_VALUES, "--set", "gateway.backend.kind=vllm")
    assert refused.returncode != 0 and "leave gateway.backend and gateway.backends unset" in refused.stderr


def test_the_rendered_engine_tier_serves_the_api_tier(helm, tmp_path):
    """An engine server started with the environment the chart gives engine pods, and a gateway with the API
    pods' configuration (the pod's name mapped onto this machine's address) answer through the SDK."""
    from engine_servers import EngineServer, tiny_engine_options  # the engine's runtime: only this test needs it

    options = tiny_engine_options(tmp_path, max_positions=1024)
    tier = ("--set", "engine.enabled=true", "--set", "engine.replicas=1")
    manifests = _render(helm, *tier, "--set-json", f"engine.options={json.dumps(options)}")
    pod = manifests["StatefulSet/gw-gpt-oss-gateway-engine"]["spec"]["template"]["spec"]
    secret = manifests["Secret/gw-gpt-oss-gateway"]["data"]
    engine_env = {}
    for entry in pod["containers"][0]["env"]:
        value = entry.get("value")
        if value is None:
            value = base64.b64decode(secret[entry["valueFrom"]["secretKeyRef"]["key"]]).decode()
        engine_env[entry["name"]] = value
    for name in ("HOME", "GATEWAY_ENGINE_HOST", "GATEWAY_ENGINE_PORT"):
        engine_env.pop(name)
    server = EngineServer(json.loads(engine_env.pop("GATEWAY_ENGINE_OPTIONS")), tmp_path / "engine.log", **engine_env)
    server.start()
    env = _gateway_env(manifests, tmp_path, None)
    env.update(GATEWAY_BACKEND_URLS=server.url, GATEWAY_AUTH="off", GATEWAY_MOCK_SCRIPT="")
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        answer = api.responses.create(model="gpt-oss-20b", input="hello", max_output_tokens=16, temperature=0)
        assert answer.status in ("completed", "incomplete") and answer.usage.output_tokens > 0
        assert server.metrics()["vllm:prefix_cache_queries_total"] > 0  # it ran on the engine server
    finally:
        gateway.stop()
        server.stop()
