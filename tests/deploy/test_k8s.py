"""deploy/k8s: every overlay renders (tests/deploy/kustomize.py, or kustomize where installed,
which must agree) into objects that validate offline against the Kubernetes JSON schemas
(the kubernetes-validate package bundles them), strictly: an unknown or misspelt field is an
error. The configuration they carry is one the gateway accepts, mounted where it reads it,
and the policy-sync sidecar keeps the policy live across repeated ConfigMap updates."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import signal
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from gateway.cli import main as gateway_cli
from gateway.policy import PolicyStore
from tests.conftest import GatewayServer
from tests.deploy.kustomize import render
from tests.deploy.promql import ROOT

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
#: The oldest Kubernetes the manifests are for (native sidecars: 1.29), and the newest the
#: schemas know.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


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


def test_the_overlays_are_the_documented_ones() -> None:
    assert OVERLAYS == ["cpu", "external-redis", "gpu"]


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
    gateway, sync = container(pod, "gateway"), container(pod, "policy-sync")
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_cm = config_map(overlay, "llm-gateway-config-")
    policy_cm = config_map(overlay, "llm-gateway-policy")
    # gateway --config names gateway.toml in the config volume, which is that ConfigMap.
    config_path = Path(gateway["args"][gateway["args"].index("--config") + 1])
    assert str(config_path.parent) == mounts["config"]
    assert volumes["config"]["configMap"]["name"] == config_cm["metadata"]["name"]
    assert set(config_cm["data"]) == {config_path.name}
    # server.policy is the file policy-sync writes, in the volume the gateway mounts.
    text = config_cm["data"][config_path.name]
    policy_path = Path(tomllib.loads(text)["server"]["policy"])
    sync_env = {e["name"]: e["value"] for e in sync["env"]}
    assert str(policy_path.parent) == mounts["policy"] and sync_env["DST"] == str(policy_path)
    source = Path(sync_env["SRC"])
    assert {m["mountPath"]: m["name"] for m in sync["volumeMounts"]}[str(source.parent)] == \
        "policy-source"
    assert volumes["policy-source"]["configMap"]["name"] == policy_cm["metadata"]["name"]
    assert set(policy_cm["data"]) == {source.name}
    # And `gateway check` accepts the two files (the policy read from a local copy).
    (tmp_path / source.name).write_text(policy_cm["data"][source.name])
    local = text.replace(f'"{policy_path}"', f'"{tmp_path / source.name}"')
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


class ConfigMapVolume:
    """A ConfigMap volume as the kubelet writes it (its AtomicWriter): the file is a symlink
    through ``..data`` into a timestamped folder; an update writes a new folder, swaps
    ``..data`` and deletes the old one."""

    def __init__(self, root: Path, name: str):
        self.root, self.name, self.n = root, name, 0
        root.mkdir()

    def publish(self, text: str) -> None:
        self.n += 1
        folder = self.root / f"..2026_01_01_00_00_{self.n:02d}.{os.getpid()}"
        folder.mkdir()
        (folder / self.name).write_text(text)
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        os.symlink(folder.name, self.root / "..data_tmp")
        os.rename(self.root / "..data_tmp", data)
        if not (self.root / self.name).is_symlink():
            os.symlink(f"..data/{self.name}", self.root / self.name)
        if old:
            shutil.rmtree(self.root / old)


async def test_policy_sync_keeps_the_policy_live_across_configmap_updates(tmp_path: Path) -> None:
    """The sidecar's own script, run on a simulated ConfigMap volume; the gateway's policy
    watcher on its output sees every update, not just the first."""
    sync = container(deployment("cpu")["spec"]["template"]["spec"], "policy-sync")
    source = ConfigMapVolume(tmp_path / "source", "policy.toml")
    source.publish('version = "v1"\n')
    live = tmp_path / "live"
    live.mkdir()
    env = {**os.environ, "SRC": str(source.root / "policy.toml"),
           "DST": str(live / "policy.toml"), "EVERY_S": "0.1"}
    process = await asyncio.create_subprocess_exec(*sync["command"], *sync["args"], env=env)
    try:
        for _ in range(100):
            if (live / "policy.toml").exists():
                break
            await asyncio.sleep(0.05)
        store = PolicyStore(live / "policy.toml")
        assert store.current.version == "v1"
        ready = asyncio.Event()
        watch = asyncio.create_task(store.watch(ready))
        await ready.wait()
        for version in ("v2", "v3", "v4"):
            generation = store.generation
            source.publish(f'version = "{version}"\n')
            assert await asyncio.to_thread(store.wait_generation, generation, 10.0), version
            assert store.current.version == version
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    finally:
        process.send_signal(signal.SIGTERM)  # the kubelet's stop: it exits at once
        assert await asyncio.wait_for(process.wait(), 5) == 0
