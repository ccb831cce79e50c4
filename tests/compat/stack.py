"""What a compatibility test runs a client against: the gateway, as a new user configures it
(the default policy, a key, models by family), in front of the fake upstreams; and what it saw.

- :func:`gateway_toml`: the config. Upstreams ``openai`` (chat completions only: a Responses
  request is translated), ``openai_responses`` (serves ``/v1/responses`` itself) and
  ``anthropic``, all on the session's fakes, each sending the test's steering headers
  (``x-fake-tool: agent``: the fakes call the client's own tools, gateway.testing.tool_args).
  Models: the families ``claude-*`` and ``gpt-*`` (the ids Claude Code and Codex pick by
  default) routed where the test says, and exact ids for the clients whose model the test
  names (:data:`MODELS`).
- :class:`Recorder`: the gateway app wrapped, noting every exchange as its client saw it
  (method, path, status, an error's body), websocket attempts included, so a test can assert
  "no 4xx or 5xx" beyond what the request log records.
- :class:`Stack`: one test's gateway, its records and log, and :meth:`Stack.report`, the
  account a failing test prints: the client's command, exit code and output, every exchange.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from gateway.testing.tool_args import MARKER, tool_results
from gateway.types import Message, Receive, Scope, Send
from tests.conftest import LogSink

__all__ = ["GATEWAY_KEY", "MODELS", "UPSTREAM_KEY_ENV", "ClientRun", "Exchange", "Recorder",
           "Stack", "gateway_toml", "run_client"]

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "default.toml"
#: The key clients send (the config holds its SHA-256 only).
GATEWAY_KEY = "sk-compat-gateway-key"
#: Where the gateway reads the upstreams' key (the fakes accept any).
UPSTREAM_KEY_ENV = "GATEWAY_COMPAT_UPSTREAM_KEY"
#: Exact model ids -> upstream: the clients whose model a test chooses, and the two that the
#: default policy's router tiers name (gateway.example.toml's).
MODELS = {"gpt-compat": "openai", "gpt-compat-native": "openai_responses",
          "claude-compat": "anthropic", "smollm2": "openai", "gpt-4o": "openai"}


def gateway_toml(openai_url: str, anthropic_url: str, *, claude: str = "anthropic",
                 gpt: str = "openai", steer: dict[str, str] | None = None) -> str:
    """The config; ``claude``/``gpt``: the upstream of the ``claude-*``/``gpt-*`` family."""
    headers = "{ " + ", ".join(f'"{k}" = "{v}"' for k, v in (steer or {}).items()) + " }"
    digest = hashlib.sha256(GATEWAY_KEY.encode()).hexdigest()
    upstream = f'api_key_env = "{UPSTREAM_KEY_ENV}"\nheaders = {headers}\nread_timeout_ms = 60000'
    models = "".join(f'[models."{name}"]\ntargets = [{{ upstream = "{to}", model = "{name}" }}]\n'
                     for name, to in MODELS.items())
    return f"""
[server]
policy = "{POLICY}"

[logging]
requests = false

[[auth.keys]]
id = "compat"
sha256 = "{digest}"

[upstreams.openai]
type = "openai"
base_url = "{openai_url}/v1"
{upstream}

[upstreams.openai_responses]
type = "openai"
base_url = "{openai_url}/v1"
native_responses = true
{upstream}

[upstreams.anthropic]
type = "anthropic"
base_url = "{anthropic_url}"
{upstream}

# Families, as a new user writes them (issue 46: model entries by pattern), the id passed
# through ("{{model}}": a template; before patterns, a name no client sends).
[models."claude-*"]
targets = [{{ upstream = "{claude}", model = "{{model}}" }}]

[models."gpt-*"]
targets = [{{ upstream = "{gpt}", model = "{{model}}" }}]

{models}"""


@dataclass
class Exchange:
    """One request as the gateway answered it: the client's headers (no keys) and body, the
    status and ``body``, an error answer's first 2 KB."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    request: bytes = b""
    status: int | None = None
    body: bytes = b""

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "headers": self.headers,
                "request": _readable(self.request), "status": self.status,
                "answer": _readable(self.body)}

    def __str__(self) -> str:
        text = self.body.decode("utf-8", "replace").strip()
        return f"{self.method} {self.path} -> {self.status}" + (f": {text}" if text else "")


class Recorder:
    """The gateway app, wrapped: each HTTP exchange and websocket attempt is an
    :class:`Exchange` in ``exchanges`` (a websocket refused before accepting: status 403, as
    uvicorn answers it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.gateway = app.gateway  # ServerThread takes the connection limits from it
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        websocket = scope["type"] == "websocket"
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k.lower() not in _SECRET}
        exchange = Exchange("WEBSOCKET" if websocket else scope["method"], scope["path"],
                            headers)
        self.exchanges.append(exchange)

        async def reading() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                exchange.request += message.get("body", b"")
            return message

        async def noting(message: Message) -> None:
            kind = message["type"]
            if kind in ("http.response.start", "websocket.http.response.start"):
                exchange.status = message["status"]
            elif kind == "websocket.accept":
                exchange.status = 101
            elif kind == "websocket.close" and exchange.status is None:
                exchange.status = 403
            elif kind.endswith("response.body") and (exchange.status or 0) >= 400:
                exchange.body = (exchange.body + message.get("body", b""))[:2048]
            await send(message)

        await self.app(scope, reading, noting)


_SECRET = frozenset({b"authorization", b"x-api-key", b"api-key", b"cookie"})


def _readable(body: bytes) -> Any:
    """A body for a JSON report: its JSON, else its text."""
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


@dataclass
class ClientRun:
    """A client process that ran: its command, exit code (None: killed at the timeout)."""

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def run_client(argv: list[str], cwd: Path, env: dict[str, str],
               timeout: float = 180.0) -> ClientRun:
    """Run a client to its end (stdin closed); past ``timeout`` seconds its process group
    is killed and ``returncode`` is None."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, text=True, errors="replace")
    try:
        out, err = process.communicate(timeout=timeout)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        code = None
    try:  # what it left running (a sandbox helper, a language server)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return ClientRun(argv, code, out, err, time.monotonic() - started)


@dataclass
class Stack:
    """One test's gateway (``url``) over the session's fakes, and what it saw."""

    url: str
    openai: FakeUpstream
    anthropic: FakeAnthropic
    recorder: Recorder
    sink: LogSink
    server: ServerThread
    #: The client's home and working directory (a file :data:`tool_args.FILE` in it).
    home: Path
    workdir: Path
    runs: list[ClientRun] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        """A client's environment: nothing of this machine's user but PATH; HOME, the XDG
        folders and TMPDIR in the test's folder."""
        tmp = self.home.parent / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "HOME": str(self.home), "TERM": "dumb", "NO_COLOR": "1", "TMPDIR": str(tmp),
               "XDG_CONFIG_HOME": str(self.home / ".config"),
               "XDG_CACHE_HOME": str(self.home / ".cache"),
               "XDG_DATA_HOME": str(self.home / ".local" / "share"),
               "XDG_STATE_HOME": str(self.home / ".local" / "state")}
        return env | extra

    def run(self, argv: list[str], env: dict[str, str], timeout: float = 180.0) -> ClientRun:
        run = run_client(argv, self.workdir, env, timeout)
        self.runs.append(run)
        return run

    def errors(self) -> list[Exchange]:
        """The exchanges the gateway answered with a 4xx or 5xx (or never answered)."""
        return [e for e in self.recorder.exchanges if e.status is None or e.status >= 400]

    def logged_errors(self) -> list[dict[str, Any]]:
        """The request log's records of a 4xx or 5xx."""
        return [r for r in self.sink.records if (r.get("status") or 0) >= 400]

    def upstream_bodies(self) -> list[tuple[str, Any]]:
        """(API, body) of every request the fakes received: chat, responses or anthropic."""
        out: list[tuple[str, Any]] = []
        for rec in [*self.openai.records, *self.anthropic.records]:
            api = "anthropic" if rec.path.startswith("/v1/messages") else \
                "responses" if "/responses" in rec.path else "chat"
            if rec.method == "POST":
                out.append((api, rec.json))
        return out

    def tool_outputs(self) -> list[str]:
        """The text of every tool result the client sent back to an upstream."""
        return [text for api, body in self.upstream_bodies() for text in tool_results(api, body)]

    def assert_finished(self, run: ClientRun) -> None:
        """The client exited 0, the gateway answered no 4xx or 5xx and logged none."""
        api = [e for e in self.recorder.exchanges if e.path.startswith("/v1/")]
        try:  # a record is written once its answer's last byte is sent
            self.sink.wait(len(api), timeout=2.0)
        except TimeoutError:
            pass
        problems = [f"the client exited {run.returncode}"] if run.returncode != 0 else []
        if errors := self.errors():
            problems.append(f"the gateway answered {len(errors)} error(s): {errors[0]}")
        if logged := self.logged_errors():
            problems.append(f"the request log holds {len(logged)} error(s)")
        assert not problems, "; ".join(problems) + "\n" + self.report()

    def assert_tool_ran(self) -> None:
        """A tool result holding tool_args.MARKER reached an upstream: the client ran the
        tool the fake called (its arguments never hold the marker)."""
        assert any(MARKER in text for text in self.tool_outputs()), (
            f"no tool result holding {MARKER!r} reached an upstream; tool results: "
            f"{[t[:200] for t in self.tool_outputs()]}\n" + self.report())

    def dump(self, folder: Path) -> None:
        """Write what the clients sent the gateway (``exchanges.json``: every request, its
        headers less keys, its body, the answer's status and an error's body) and what the
        fakes got (``upstream.json``) into ``folder``."""
        (folder / "exchanges.json").write_bytes(orjson.dumps(
            [e.as_dict() for e in self.recorder.exchanges], option=orjson.OPT_INDENT_2))
        got = [{"path": r.path, "method": r.method, "headers": {
            k: v for k, v in r.headers.items() if k.encode() not in _SECRET}, "body": r.json}
            for r in [*self.openai.records, *self.anthropic.records]]
        (folder / "upstream.json").write_bytes(orjson.dumps(got, option=orjson.OPT_INDENT_2))

    def report(self) -> str:
        """What the client did and what the gateway answered, for a failing assertion."""
        lines = []
        for run in self.runs:
            code = "killed at its timeout" if run.returncode is None else run.returncode
            lines += [f"$ {' '.join(run.argv)}", f"exit: {code} after {run.seconds:.1f} s",
                      "stdout (end): " + run.stdout[-1500:].strip(),
                      "stderr (end): " + run.stderr[-2500:].strip()]
        lines.append("gateway answered:")
        lines += [f"  {e}" for e in self.recorder.exchanges] or ["  nothing"]
        lines.append(f"request log: {len(self.sink.records)} records, "
                     f"{len(self.logged_errors())} errors " + "; ".join(
                         f"{r.get('route')} {r.get('status')} {r.get('error_type')}"
                         for r in self.logged_errors()))
        lines.append(f"upstreams got: {len(self.upstream_bodies())} requests (the bodies: "
                     f"exchanges.json and upstream.json in {self.workdir.parent})")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: the exchanges' statuses."""
        statuses = [f"{e.method} {e.path} {e.status}" for e in self.recorder.exchanges]
        return ", ".join(statuses) or "no request"
