"""LiteLLM's proxy as the workload bench's comparison path, pinned and configured as its docs say.

- :func:`ensure`: installs ``litellm[proxy]==`` :data:`LITELLM_VERSION` on first use into
  ``.cache/bench/litellm/venv`` (git-ignored; ``GATEWAY_BENCH_LITELLM_DIR`` moves the folder;
  a venv of this interpreter apart from the project's, reinstalled only when the pin changes:
  a ``.pins`` stamp, as tests/compat/install.py does); returns the ``litellm`` executable.
  Stdlib only. Measured here: 32 s, 608 MB, 118 packages (from the machine's pip index).
- :func:`config_yaml`: the proxy's ``config.yaml`` for a list of :class:`ModelRoute`, with
  each setting the issue names, as the page cited beside it recommends:

  - response cache in memory: ``litellm_settings.cache: true``, ``cache_params.type: local``
    (https://docs.litellm.ai/docs/proxy/caching, "In Memory Cache"; by default it covers
    ``acompletion`` and ``aanthropic_messages`` alike, so /v1/chat/completions and /v1/messages);
  - prompt caching for Anthropic models: ``cache_control_injection_points`` on the system
    message (``role: system``) and on the last message (``index: -1``)
    (https://docs.litellm.ai/docs/tutorials/prompt_caching); the marker goes on the last
    content block of each;
  - retries: ``router_settings.num_retries: 2``
    (https://docs.litellm.ai/docs/router/api_reference/configuration: the Router's arguments
    sit under ``router_settings`` in the proxy's config;
    https://docs.litellm.ai/docs/proxy/reliability shows the same key);
  - streamed usage on every stream: ``general_settings.always_include_stream_usage: true``
    (https://docs.litellm.ai/docs/completion/usage, "Proxy: Always Include Streaming Usage").

  Anthropic-format clients use the proxy's ``/v1/messages`` for any model
  (https://docs.litellm.ai/docs/anthropic_unified): an ``anthropic/`` model gets the body on
  its own Messages API (re-serialized: string contents become text blocks, the markers above
  added, the client's ``anthropic-beta`` forwarded); an ``openai/`` one goes, by LiteLLM's
  default, to the upstream's Responses API (BerriAI/litellm
  docs/my-website/docs/anthropic_unified/messages_to_responses_mapping.md), which the provider
  simulator does not serve, so the config sets LiteLLM's own switch
  ``use_chat_completions_url_for_anthropic_messages`` (``messages_via_chat``) and it goes as
  chat completions.
- :class:`LiteLLMProxy`: ``litellm --config FILE --host 127.0.0.1 --port N`` in its own process
  group, offline (:func:`offline_env`), ready once ``/health/readiness`` answers 200;
  ``url``, ``pid``, ``master_key``, ``cpu_seconds()``, ``stop()``. Measured here (2 shared
  cores): ready in ~11 s having used ~11 CPU seconds (the runner should count the proxy's
  CPU from ready, or say it includes the start); ~25-35 CPU ms per streamed request in front
  of a fake that answers at once, miss or cache hit alike; a 500 or 429 is tried 3 times in
  all (~0.5-1.7 s apart) before the client gets it (Anthropic's 529 reaches the client as
  a 500). An upstream stream cut before its end reaches a chat-completions client (either
  kind of model) and a /v1/messages client of an OpenAI-format model as a complete answer
  (``finish_reason: stop`` / ``end_turn``, usage counted by LiteLLM), and the response cache
  then serves that truncated answer to repeats; only native /v1/messages to Claude passes
  the cut on (no ``message_stop``) and caches nothing. A cache hit carries the original
  answer's usage.

Offline at run time: the proxy fetches its model cost map from GitHub at startup
(https://docs.litellm.ai/docs/proxy/model_cost_map) unless ``LITELLM_LOCAL_MODEL_COST_MAP=True``
(named in the docstring of the installed package's
litellm/litellm_core_utils/get_model_cost_map.py); its other ``LITELLM_LOCAL_*`` switches
(Anthropic beta headers, auto-router presets, blog posts, policy templates: names from the
package's source) are set too. Usage telemetry (from v1.107.0) is off unless turned on and
never leaves without an endpoint (https://docs.litellm.ai/docs/proxy/telemetry);
``LITELLM_TELEMETRY_DISABLED=true`` (its settings' veto) makes that explicit. Checked with
strace: starting and answering, the proxy connects to nothing but its upstreams (it also asks
an OpenAI upstream ``GET /v1/models`` once).

    python bench/litellm_proxy.py    # install (if needed) and print the executable
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

__all__ = ["LITELLM_VERSION", "LiteLLMProxy", "ModelRoute", "config_yaml", "ensure",
           "executable", "folder", "installed", "offline_env", "tree_cpu_seconds"]

#: The version the issue measured (PyPI has it).
LITELLM_VERSION = "1.108.7"
PYPI = {"litellm[proxy]": LITELLM_VERSION}

ROOT = Path(__file__).resolve().parents[1]


def folder() -> Path:
    """Where the venv lives (``GATEWAY_BENCH_LITELLM_DIR`` or ``.cache/bench/litellm``)."""
    return Path(os.environ.get("GATEWAY_BENCH_LITELLM_DIR") or ROOT / ".cache" / "bench" / "litellm")


def executable() -> Path:
    """The ``litellm`` executable :func:`ensure` installs (it may not exist yet)."""
    return folder() / "venv" / "bin" / "litellm"


def installed() -> bool:
    """Whether the pinned version is installed (what a test checks before skipping)."""
    stamp = folder() / "venv" / ".pins"
    return executable().exists() and stamp.exists() and stamp.read_text() == _wanted()


def _wanted() -> str:
    return json.dumps(PYPI, sort_keys=True)


def ensure(log: bool = False) -> Path:
    """Install the pinned LiteLLM if missing or pinned otherwise; returns its ``litellm``.
    Raises ``subprocess.CalledProcessError`` when venv or pip fails (their output shown)."""
    base = folder()
    base.mkdir(parents=True, exist_ok=True)
    venv = base / "venv"
    with open(base / ".lock", "w") as lock:  # two runs at once install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed():
            return executable()
        started = time.monotonic()
        for step in ([sys.executable, "-m", "venv", "--clear", str(venv)],
                     [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile",
                      "--disable-pip-version-check", *(f"{k}=={v}" for k, v in PYPI.items())]):
            subprocess.run(step, check=True, stdin=subprocess.DEVNULL)
        if not executable().exists():
            raise FileNotFoundError(f"installed, but still missing: {executable()}")
        (venv / ".pins").write_text(_wanted())
        if log:
            print(f"installed litellm {LITELLM_VERSION} in {time.monotonic() - started:.0f} s",
                  flush=True)
    return executable()


@dataclass(frozen=True)
class ModelRoute:
    """One public model of the proxy. ``base_url``: the upstream's root, without ``/v1``
    (e.g. ``http://127.0.0.1:8001``: the proxy calls ``/v1/chat/completions`` or
    ``/v1/messages`` under it); ``api_key_env``: the variable holding the upstream key, read
    by the proxy process (``os.environ/NAME`` in its config)."""

    name: str
    api: Literal["openai", "anthropic"]
    base_url: str
    upstream_model: str
    api_key_env: str


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def config_yaml(models: list[ModelRoute], num_retries: int = 2,
                messages_via_chat: bool = True) -> str:
    """The proxy's config.yaml for ``models`` (see the module docstring for each setting's
    source). ``messages_via_chat``: /v1/messages for an ``openai`` model goes upstream as
    chat completions (LiteLLM's own default, False, calls the upstream's Responses API, which
    the provider simulator does not serve). Raises ValueError on an unknown ``api``."""
    lines = [f"# LiteLLM {LITELLM_VERSION} proxy config, written by bench/litellm_proxy.py",
             "model_list:"]
    for m in models:
        if m.api == "openai":
            # OpenAI-compatible upstream: api_base ends in /v1, as the openai SDK's base_url.
            model, api_base = f"openai/{m.upstream_model}", m.base_url.rstrip("/") + "/v1"
        elif m.api == "anthropic":
            # LiteLLM appends /v1/messages to an anthropic api_base.
            model, api_base = f"anthropic/{m.upstream_model}", m.base_url.rstrip("/")
        else:
            raise ValueError(f"model {m.name!r}: api must be 'openai' or 'anthropic', not {m.api!r}")
        lines += [f"  - model_name: {_q(m.name)}",
                  "    litellm_params:",
                  f"      model: {_q(model)}",
                  f"      api_base: {_q(api_base)}",
                  f"      api_key: {_q('os.environ/' + m.api_key_env)}"]
        if m.api == "anthropic":
            lines += [
                "      # Prompt caching: a cache_control marker on the system message and on the",
                "      # last message (https://docs.litellm.ai/docs/tutorials/prompt_caching:",
                "      # role targets every message of that role, index -1 the last message).",
                "      cache_control_injection_points:",
                "        - location: message",
                "          role: system",
                "        - location: message",
                "          index: -1"]
    lines += [
        "litellm_settings:",
        "  # Response cache in this process's memory",
        "  # (https://docs.litellm.ai/docs/proxy/caching, In Memory Cache).",
        "  cache: true",
        "  cache_params:",
        "    type: local",
        *([
            "  # /v1/messages to an OpenAI-format model: upstream as chat completions, not as",
            "  # its default Responses API (litellm.use_chat_completions_url_for_anthropic_messages;",
            "  # docs/my-website/docs/anthropic_unified/messages_to_responses_mapping.md).",
            "  use_chat_completions_url_for_anthropic_messages: true"] if messages_via_chat else []),
        "router_settings:",
        "  # Retries per request (https://docs.litellm.ai/docs/router/api_reference/configuration;",
        "  # https://docs.litellm.ai/docs/proxy/reliability).",
        f"  num_retries: {int(num_retries)}",
        "general_settings:",
        "  # Usage in the last chunk of every stream, asked for or not",
        "  # (https://docs.litellm.ai/docs/completion/usage).",
        "  always_include_stream_usage: true",
    ]
    return "\n".join(lines) + "\n"


def offline_env() -> dict[str, str]:
    """The variables that keep the proxy off the internet (see the module docstring)."""
    env = {f"LITELLM_LOCAL_{name}": "True" for name in (
        "MODEL_COST_MAP", "ANTHROPIC_BETA_HEADERS", "AUTOROUTER_PRESETS", "BLOG_POSTS",
        "POLICY_TEMPLATES")}
    env["LITELLM_TELEMETRY_DISABLED"] = "true"
    env["LITELLM_LOG"] = "ERROR"  # its per-request INFO lines cost CPU the bench measures
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_cpu_seconds(root: int) -> float:
    """user+sys of ``root`` and every live descendant, plus what ``root``'s reaped children
    used (/proc/PID/stat fields 14-17, in clock ticks)."""
    stats: dict[int, tuple[int, list[str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()  # the name may hold spaces and parens
        stats[int(entry)] = (int(fields[1]), fields)
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _) in stats.items() if ppid == parent and pid not in tree]
        tree.update(kids)
        frontier += kids
    ticks = 0
    for pid in tree:
        if pid in stats:
            f = stats[pid][1]
            ticks += int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if pid == root else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


class LiteLLMProxy:
    """``with LiteLLMProxy(models) as proxy: proxy.url`` runs the pinned proxy (installed by
    :func:`ensure` first) on a loopback port until the block ends.

    ``models``: the routes (or ``config``: a config.yaml text instead); ``env``: extra
    variables for the proxy (the upstream keys its config names); ``port``: 0 picks a free one;
    ``workdir``: where the config and ``litellm.log`` (its stdout and stderr) go (default: a
    temporary folder removed on stop). Clients send :attr:`master_key` (``Authorization:
    Bearer`` or ``x-api-key``): this version refuses to start without one (its startup error
    names ``LITELLM_MASTER_KEY``, set here; default: a random key). Raises RuntimeError (with the log's tail) when it exits
    or does not answer ``/health/readiness`` within ``start_timeout_s``."""

    def __init__(self, models: list[ModelRoute] | None = None, *, config: str | None = None,
                 env: dict[str, str] | None = None, port: int = 0,
                 workdir: Path | None = None, start_timeout_s: float = 120.0,
                 master_key: str | None = None) -> None:
        if (models is None) == (config is None):
            raise ValueError("give models or config, not both")
        self.config = config if config is not None else config_yaml(models or [])
        self.master_key = master_key or "sk-bench-" + secrets.token_hex(16)
        self.env = {**(env or {}), "LITELLM_MASTER_KEY": self.master_key}
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="litellm-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.log_path = self.workdir / "litellm.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: Seconds from the spawn to the first 200 from /health/readiness.
        self.start_seconds: float | None = None
        self._final_cpu: float | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("not started")
        return self.process.pid

    def start(self) -> Self:
        exe = ensure()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "config.yaml"
        config_path.write_text(self.config)
        env = {**os.environ, **offline_env(), **self.env}
        env.pop("PYTHONPATH", None)  # the project's modules are not LiteLLM's business
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(exe), "--config", str(config_path), "--host", "127.0.0.1",
                 "--port", str(self.port)],
                cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)  # its own process group
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        assert self.process is not None
        while time.monotonic() - started < self.start_timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"litellm exited with {self.process.returncode}:\n"
                                   + self.log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health/readiness", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"litellm not ready after {self.start_timeout_s:.0f} s:\n"
                           + self.log_tail())

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """user+sys CPU seconds of the proxy and its children so far (from /proc); after
        :meth:`stop`, what they had used when it was asked to stop."""
        if self.process is None and self._final_cpu is not None:
            return self._final_cpu
        return tree_cpu_seconds(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to its process group, SIGKILL after ``timeout_s``; idempotent."""
        process = self.process
        if process is not None and process.poll() is None:
            self._final_cpu = tree_cpu_seconds(process.pid)
        self.process = None
        if process is not None and process.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if process is not None and process.returncode is None:
            process.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    print(ensure(log=True))
