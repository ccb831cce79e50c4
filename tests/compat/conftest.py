"""Fixtures of the compatibility suite (``make compat``; not part of ``make test``, see
pyproject's ``--ignore``): the clients installed on first use (install.py), the fake upstreams
for the session, and :func:`stack`, a fresh gateway for each test (stack.py).

Each test's files are in ``.cache/compat/runs/<test>/`` (``home/``, ``work/``, ``tmp/``, the
gateway's config, and what the clients sent: ``exchanges.json``, ``upstream.json``), kept
until the test runs again so a failure can be looked into; not under /tmp, where Codex
refuses to put its helper binaries. At the end the session prints one line per
client run: what it was, its outcome and every status the gateway answered.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Generator, Iterator

import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from gateway.testing.tool_args import FILE, MARKER
from tests.compat.install import Clients, ensure
from tests.compat.stack import UPSTREAM_KEY_ENV, Recorder, Stack, gateway_toml
from tests.conftest import LogSink

_LINES = pytest.StashKey[list[str]]()
_OUTCOME = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LINES] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                        pytest.TestReport]:
    report = yield
    if report.when == "call" or report.failed:
        item.stash[_OUTCOME] = report.outcome
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_LINES, [])
    if lines:
        terminalreporter.section("what each client did and what the gateway answered")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def clients() -> Clients:
    """The pinned clients, installed now if missing."""
    return ensure(log=True)


@pytest.fixture(scope="session")
def fakes() -> Iterator[tuple[FakeUpstream, str, FakeAnthropic, str]]:
    """The fake OpenAI upstream (chat and Responses) and the fake Anthropic, for the session."""
    openai, anthropic = FakeUpstream(), FakeAnthropic()
    with ServerThread(openai) as o, ServerThread(anthropic) as a:
        yield openai, o.url, anthropic, a.url


@pytest.fixture(scope="session", autouse=True)
def upstream_key() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(UPSTREAM_KEY_ENV, "sk-compat-upstream")
        yield


@pytest.fixture
def stack(request: pytest.FixtureRequest, clients: Clients,
          fakes: tuple[FakeUpstream, str, FakeAnthropic, str]) -> Iterator[Callable[..., Stack]]:
    """``stack(claude=..., gpt=..., steer={...})``: a gateway (gateway_toml's arguments) over
    the fakes, cleared, and the client's home and working directory (a git repository, with
    ``tool_args.FILE`` holding ``MARKER``)."""
    openai, openai_url, anthropic, anthropic_url = fakes
    folder = clients.folder / "runs" / re.sub(r"[^\w.-]+", "_", request.node.name)
    made: list[Stack] = []

    def make(**options: object) -> Stack:
        openai.clear()
        anthropic.clear()
        shutil.rmtree(folder, ignore_errors=True)
        home, workdir = folder / "home", folder / "work"
        home.mkdir(parents=True)
        workdir.mkdir()
        (workdir / FILE).write_text(MARKER + "\n")
        subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
        config = folder / "gateway.toml"
        config.write_text(gateway_toml(openai_url, anthropic_url, **options))  # type: ignore[arg-type]
        sink = LogSink()
        recorder = Recorder(create_app(load_config(config), request_sink=sink,
                                       watch_policy=False))
        server = ServerThread(recorder).start()
        made.append(Stack(server.url, openai, anthropic, recorder, sink, server, home, workdir))
        return made[-1]

    yield make
    outcome = request.node.stash.get(_OUTCOME, "?")
    for made_stack in made:
        made_stack.server.stop()
        made_stack.dump(folder)
        seconds = sum(run.seconds for run in made_stack.runs)
        codes = ",".join(str(run.returncode) for run in made_stack.runs)
        request.config.stash[_LINES].append(
            f"{outcome.upper():7} {request.node.name} (exit {codes}, {seconds:.1f} s): "
            f"{made_stack.summary()}")
