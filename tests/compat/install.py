"""The compatibility suite's clients, pinned, installed on first use from the registries.

``python tests/compat/install.py`` (or :func:`ensure` from the suite's conftest) installs
what is missing into ``.cache/compat/`` (git-ignored; ``GATEWAY_COMPAT_DIR`` moves it):

- ``npm/``: the CLIs from npm (:data:`NPM`), with ``npm install --ignore-scripts``, then
  the install scripts of the two CLIs whose native binary comes in a platform package
  (:data:`NATIVE`: their scripts copy it into place, offline; until then their ``bin`` is a
  script saying so), and nothing else's; each CLI must then answer ``--version``;
- ``venv/``: a virtual environment of this interpreter with the Python clients from PyPI
  (:data:`PYPI`: the SDKs they run on are pinned too), apart from the project's own venv so
  their dependencies cannot move the project's.

Each part is reinstalled only when its pins change (a ``.pins`` file beside it). The
registries are the ones npm and pip are configured with on this machine. Stdlib only.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NPM", "PYPI", "Clients", "ensure"]

#: npm packages: name -> version (``npm view NAME@VERSION version`` checks one exists).
NPM = {"@anthropic-ai/claude-code": "2.1.197", "@openai/codex": "0.171.0",
       "opencode-ai": "1.18.33"}
#: npm packages whose ``bin`` their install script puts in place (from an optional
#: dependency for the platform, already installed): their scripts run (``npm rebuild``).
NATIVE = ("@anthropic-ai/claude-code", "opencode-ai")
#: PyPI packages: the clients, then the SDKs under them.
PYPI = {"openai-agents": "0.24.0", "langchain-openai": "1.7.4", "langchain-anthropic": "1.7.10",
        "langchain-core": "1.8.3", "openai": "3.57.0", "anthropic": "2.14.0"}

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Clients:
    """Where the installed clients are."""

    folder: Path
    claude: Path
    codex: Path
    opencode: Path
    #: The Python of the clients' venv (runs tests/compat/clients/*.py).
    python: Path


def folder() -> Path:
    return Path(os.environ.get("GATEWAY_COMPAT_DIR") or ROOT / ".cache" / "compat")


def ensure(log: bool = False) -> Clients:
    """Install whatever is missing or pinned otherwise; returns where the clients are.
    Raises ``subprocess.CalledProcessError`` when npm or pip fails (their output shown)."""
    base = folder()
    base.mkdir(parents=True, exist_ok=True)
    npm, venv = base / "npm", base / "venv"
    with open(base / ".lock", "w") as lock:  # two suites at once install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        bins = npm / "node_modules" / ".bin"
        _install(npm, NPM, [bins / "claude", bins / "codex", bins / "opencode"], log, lambda: [
            "npm", "install", "--prefix", str(npm), "--ignore-scripts", "--no-audit",
            "--no-fund", "--loglevel=error", *(f"{k}@{v}" for k, v in NPM.items())], lambda: [
            "npm", "rebuild", "--prefix", str(npm), "--loglevel=error", *NATIVE], *(
            (lambda b=b: [str(bins / b), "--version"]) for b in ("claude", "codex", "opencode")))
        python = venv / "bin" / "python"
        _install(venv, PYPI, [python], log, lambda: [
            sys.executable, "-m", "venv", "--clear", str(venv)], lambda: [
            str(python), "-m", "pip", "install", "-q", "--no-compile",
            "--disable-pip-version-check", *(f"{k}=={v}" for k, v in PYPI.items())])
    return Clients(base, bins / "claude", bins / "codex", bins / "opencode", python)


def _install(where: Path, pins: dict[str, str], needs: list[Path], log: bool,
             *steps: Callable[[], list[str]]) -> None:
    stamp = where / ".pins"
    wanted = json.dumps(pins, sort_keys=True)
    if stamp.exists() and stamp.read_text() == wanted and all(p.exists() for p in needs):
        return
    where.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for step in steps:
        subprocess.run(step(), check=True, stdin=subprocess.DEVNULL)
    missing = [str(p) for p in needs if not p.exists()]
    if missing:
        raise FileNotFoundError(f"installed, but still missing: {', '.join(missing)}")
    stamp.write_text(wanted)
    if log:
        print(f"installed {where.name} in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    clients = ensure(log=True)
    for name in ("claude", "codex", "opencode", "python"):
        print(f"{name}: {getattr(clients, name)}")
