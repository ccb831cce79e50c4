"""Codex CLI (install.NPM's pin) against the gateway with its default configuration: its
default model (gpt-6.2-sol: the gateway's ``gpt-*`` family), ``wire_api = "responses"``,
every default tool and feature, only a model provider whose ``base_url`` is the gateway
(``model_provider``/``[model_providers.gateway]`` in ``$CODEX_HOME/config.toml``, the way
Codex documents a proxy or gateway), and the update check off (offline).

Codex 0.171.0 offers its tools in an ``additional_tools`` input item, grouped in
``namespace`` tools, its shell reached through ``exec``, a ``custom`` (freeform) tool taking
JavaScript (its code mode) that calls ``tools.exec_command``. Each case runs on each kind of
upstream: ``openai_responses`` (serves /v1/responses: the body goes as it came),
``openai`` (chat completions: translated) and ``anthropic`` (translated). In the tool turn
the fake calls ``exec`` with a script running ``echo compat-$((40+2))`` (tool_args), and
Codex must run it (in its read-only sandbox) and send the output back.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.compat.install import Clients
from tests.compat.stack import GATEWAY_KEY, Stack

UPSTREAMS = ["openai_responses", "openai", "anthropic"]

CONFIG = """\
model_provider = "gateway"
check_for_update_on_startup = false

[model_providers.gateway]
name = "LLM gateway"
base_url = "{url}/v1"
env_key = "GATEWAY_API_KEY"
"""


def codex(stack: Stack, clients: Clients, prompt: str) -> None:
    home = stack.home / ".codex"
    home.mkdir()
    (home / "config.toml").write_text(CONFIG.format(url=stack.url))
    run = stack.run([str(clients.codex), "exec", prompt],
                    stack.env(CODEX_HOME=str(home), GATEWAY_API_KEY=GATEWAY_KEY))
    stack.assert_finished(run)
    assert "w0 w1" in run.stdout or "tok0 tok1" in run.stdout, stack.report()  # the fake's


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_codex_answers_a_plain_prompt(stack: Callable[..., Stack], clients: Clients,
                                      upstream: str) -> None:
    codex(stack(gpt=upstream), clients, "Say hello.")


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_codex_runs_its_own_tool_and_answers(stack: Callable[..., Stack], clients: Clients,
                                             upstream: str) -> None:
    s = stack(gpt=upstream, steer={"x-fake-tool": "agent"})
    codex(s, clients, "Print a marker with the shell.")
    s.assert_tool_ran()
