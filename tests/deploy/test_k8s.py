"""deploy/k8s: every overlay renders (tests/deploy/kustomize.py, or kustomize where installed,
which must agree) into objects that validate offline against the Kubernetes JSON schemas
(the kubernetes-validate package bundles them), strictly: an unknown or misspelt field is an
error. The configuration they carry is one the gateway accepts, mounted where it reads it,
and the gateway's policy watcher, reading the policy ConfigMap's volume where the pod mounts
it, loads every update the kubelet makes to it, not only the first."""

from __future__ import annotations

import asyncio
import functools
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import kubernetes_validate
import pytest
import yaml

from gateway.cli import main as gateway_cli
from gateway.policy import PolicyStore
from gateway.testing.configmap import ConfigMapVolume
from tests.conftest import GatewayServer
from tests.deploy.kustomize import render
from tests.deploy.promql import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
#: The oldest Kubernetes whose schemas kubernetes-validate bundles (the manifests use only
#: APIs stable since 1.23), and the newest it knows.
VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def objects(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(K8S / "overlays" / overlay)}


def deployment(overlay: str) -> dict[str, Any]:
    return objects(overlay)[("Deployment", "llm-gateway")]


def config_map(overlay: str, prefix: str) -> dict[str, Any]:
    [cm] = [o for (kind, name), o in objects(overlay).items()
            if kind == "ConfigMap" and name.startswith(prefix)]
    return cm


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return dict(found)


def mounted_policy(overlay: str) -> tuple[Path, str]:
    """Where the gateway reads its policy (``server.policy`` in the mounted gateway.toml)
    and the policy ConfigMap's content there, checked to be that ConfigMap's volume."""
    pod = deployment(overlay)["spec"]["template"]["spec"]
    gateway = container(pod, "gateway")
    args = gateway["args"]
    config_path = Path(args[args.index("--config") + 1])
    config = tomllib.loads(config_map(overlay, "llm-gateway-config-")["data"][config_path.name])
    policy_path = Path(config["server"]["policy"])
    [mount] = [m for m in gateway["volumeMounts"] if m["mountPath"] == str(policy_path.parent)]
    # A subPath mount is never updated by the kubelet: the whole volume must be mounted.
    assert "subPath" not in mount and "subPathExpr" not in mount
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    policy_cm = config_map(overlay, "llm-gateway-policy")
    assert volume["configMap"]["name"] == policy_cm["metadata"]["name"]
    assert set(policy_cm["data"]) == {policy_path.name}
    return policy_path, policy_cm["data"][policy_path.name]


def test_the_overlays_are_the_documented_ones() -> None:
    assert OVERLAYS == ["cpu", "external-redis", "gpu", "replicas"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay: str,
                                                               version: str) -> None:
    rendered = objects(overlay)
    kinds = {kind for kind, _ in rendered}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ConfigMap"} <= kinds
    for (kind, name), obj in rendered.items():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {kind}/{name} on {version}: {exc.message} at "
                        f"{'.'.join(map(str, exc.path))}")


def test_the_validator_rejects_a_misspelt_field() -> None:
    broken = deployment("cpu")
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


@functools.cache
def _kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "version", "--client"], capture_output=True,
                             text=True, timeout=30, check=False).stdout
        found = re.search(r"Kustomize Version: v(\d+)", out)
        # Debian's kubectl (1.20) embeds kustomize v2, which knows no `patches`.
        if found and int(found.group(1)) >= 4:
            return ["kubectl", "kustomize"]
    return None


@pytest.mark.skipif(_kustomize() is None, reason="no kustomize (v4 or newer) installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_itself_renders_the_same_objects(overlay: str) -> None:
    command = _kustomize()
    assert command is not None
    out = subprocess.run([*command, str(K8S / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out)}
    assert theirs == objects(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_accepts_the_configuration_where_the_pod_mounts_it(
        overlay: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = deployment(overlay)["spec"]["template"]["spec"]
    gateway = container(pod, "gateway")
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_cm = config_map(overlay, "llm-gateway-config-")
    # gateway --config names gateway.toml in the config volume, which is that ConfigMap.
    config_path = Path(gateway["args"][gateway["args"].index("--config") + 1])
    assert str(config_path.parent) == mounts["config"]
    assert volumes["config"]["configMap"]["name"] == config_cm["metadata"]["name"]
    assert set(config_cm["data"]) == {config_path.name}
    # server.policy is the policy ConfigMap's file, in the volume the gateway mounts.
    policy_path, policy_text = mounted_policy(overlay)
    # And `gateway check` accepts the two files (the policy read from a local copy).
    (tmp_path / policy_path.name).write_text(policy_text)
    text = config_cm["data"][config_path.name]
    local = text.replace(f'"{policy_path}"', f'"{tmp_path / policy_path.name}"')
    assert local != text
    (tmp_path / "gateway.toml").write_text(local)
    assert gateway_cli(["check", str(tmp_path / "gateway.toml")]) == 0
    assert "ok:" in capsys.readouterr().out


def test_the_gpu_overlay_changes_only_the_engine_settings() -> None:
    base = tomllib.loads((K8S / "base" / "config" / "gateway.toml").read_text())
    gpu = tomllib.loads((K8S / "overlays" / "gpu" / "gateway.toml").read_text())
    base_engine = base["upstreams"]["local"].pop("engine")
    gpu_engine = gpu["upstreams"]["local"].pop("engine")
    assert gpu == base
    assert gpu_engine["kv_cache_mb"] > base_engine["kv_cache_mb"]
    pod = deployment("gpu")["spec"]["template"]["spec"]
    assert container(pod, "gateway")["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container(pod, "gateway")["image"].endswith("-cuda")
    assert pod["tolerations"] and pod["nodeSelector"]
    assert "nvidia.com/gpu" not in str(deployment("cpu"))


def test_the_replicas_overlay_discovers_its_engines_through_a_headless_service() -> None:
    base = tomllib.loads((K8S / "base" / "config" / "gateway.toml").read_text())
    ours = tomllib.loads((K8S / "overlays" / "replicas" / "gateway.toml").read_text())
    pool = ours["upstreams"].pop("local")
    base["upstreams"].pop("local")
    assert ours == base  # the rest as the base's: the models now go to the pool
    rendered = objects("replicas")
    service = rendered[("Service", "llm-engine")]["spec"]
    engines = rendered[("Deployment", "llm-engine")]["spec"]
    url = urlsplit(pool["discover"])
    # the gateway resolves the headless Service's name: one A record per ready engine pod
    assert service["clusterIP"] == "None" and url.hostname == "llm-engine"
    assert service["selector"].items() <= engines["template"]["metadata"]["labels"].items()
    engine = container(engines["template"]["spec"], "engine")
    [port] = [p for p in engine["ports"] if p["name"] == service["ports"][0]["targetPort"]]
    assert url.port == service["ports"][0]["port"] == port["containerPort"]
    assert engine["args"][engine["args"].index("--port") + 1] == str(url.port)
    assert engine["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert engines["replicas"] >= 2 and pool["pool"]["routing"] == "prefix_precise"
    gateway = container(deployment("replicas")["spec"]["template"]["spec"], "gateway")
    assert gateway["resources"]["limits"]["memory"] == "2Gi"  # no engine in the gateway pod


def test_probes_drain_and_grace_period_fit_together() -> None:
    pod = deployment("cpu")["spec"]["template"]["spec"]
    gateway = container(pod, "gateway")
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = tomllib.loads(config_map("cpu", "llm-gateway-config-")["data"]["gateway.toml"])
    pre_stop = int(gateway["lifecycle"]["preStop"]["exec"]["command"][-1])
    # The drain must end (and the engine stop) before the kubelet's SIGKILL.
    assert pre_stop + config["server"]["drain_timeout_s"] + 5 <= \
        pod["terminationGracePeriodSeconds"]
    assert config["server"]["host"] == "0.0.0.0"
    assert gateway["ports"][0]["containerPort"] == config["server"]["port"]


def test_the_probed_paths_answer_on_a_gateway(gw: GatewayServer) -> None:
    assert httpx.get(gw.url + "/healthz").status_code == 200
    assert httpx.get(gw.url + "/readyz").status_code == 200


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_the_gateway_loads_every_update_of_the_mounted_policy_configmap(
        overlay: str, tmp_path: Path) -> None:
    """The policy ConfigMap's volume simulated under tmp_path at the path the pod mounts it,
    the gateway's policy watcher on the file server.policy names: three successive updates
    (each a new timestamped folder and a ..data swap) all load."""
    policy_path, text = mounted_policy(overlay)
    volume = ConfigMapVolume(tmp_path / policy_path.parent.relative_to("/"), policy_path.name)
    volume.publish(text)
    store = PolicyStore(volume.root / policy_path.name)
    first = store.current.version
    ready = asyncio.Event()
    watch = asyncio.create_task(store.watch(ready))
    try:
        await ready.wait()
        for n in (2, 3, 4):
            version = f"{first}-update-{n}"
            volume.publish(text.replace(f'version = "{first}"', f'version = "{version}"'))
            for _ in range(200):  # the watcher reloads on its own: wait for it, up to 10 s
                if store.current.version == version:
                    break
                await asyncio.sleep(0.05)
            assert store.current.version == version
        assert (store.reloads, store.rejected) == (3, 0)
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
