"""opencode (install.NPM's pin) against the gateway: ``opencode run`` with a project config
(``opencode.json`` in its working directory) whose provider points at the gateway, each of
the three ways opencode speaks to one:

- ``openai-compatible``: a provider of its own (``npm: @ai-sdk/openai-compatible``), chat
  completions, model ``gpt-compat``;
- ``anthropic``: opencode's Anthropic provider with ``options.baseURL`` the gateway's /v1,
  model ``claude-compat`` (Messages);
- ``openai``: opencode's OpenAI provider so redirected, model ``gpt-compat`` (Responses,
  translated to the chat upstream).

Its other models (the small one it titles sessions with) are its own defaults. In the tool
turn the fake calls its ``bash`` tool with ``echo compat-$((40+2))`` (tool_args); opencode
must run it and send the output back. Offline: no auto-update, no models.dev fetch, no LSP
download, and npm (which it runs for its config folder's plugin package) offline.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.compat.install import Clients
from tests.compat.stack import GATEWAY_KEY, Stack

#: provider kind -> (provider id, its config, the model)
PROVIDERS = {
    "openai-compatible": ("gateway", {"npm": "@ai-sdk/openai-compatible",
                                      "name": "LLM gateway"}, "gpt-compat"),
    "anthropic": ("anthropic", {}, "claude-compat"),
    "openai": ("openai", {}, "gpt-compat"),
}


def opencode(stack: Stack, clients: Clients, kind: str, prompt: str) -> None:
    provider, extra, model = PROVIDERS[kind]
    config = {"$schema": "https://opencode.ai/config.json", "model": f"{provider}/{model}",
              "provider": {provider: {**extra, "models": {model: {"name": model}}, "options": {
                  "baseURL": f"{stack.url}/v1", "apiKey": "{env:GATEWAY_API_KEY}"}}}}
    (stack.workdir / "opencode.json").write_text(json.dumps(config, indent=2))
    env = stack.env(GATEWAY_API_KEY=GATEWAY_KEY, OPENCODE_DISABLE_AUTOUPDATE="1",
                    OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1",
                    npm_config_offline="true")
    run = stack.run([str(clients.opencode), "run", prompt], env)
    stack.assert_finished(run)
    assert "w0 w1" in run.stdout or "tok0 tok1" in run.stdout, stack.report()  # the fake's


@pytest.mark.parametrize("kind", PROVIDERS)
def test_opencode_answers_a_plain_prompt(stack: Callable[..., Stack], clients: Clients,
                                         kind: str) -> None:
    opencode(stack(), clients, kind, "Say hello.")


@pytest.mark.parametrize("kind", PROVIDERS)
def test_opencode_runs_its_own_tool_and_answers(stack: Callable[..., Stack], clients: Clients,
                                                kind: str) -> None:
    s = stack(steer={"x-fake-tool": "agent"})
    opencode(s, clients, kind, "Print a marker with the shell.")
    s.assert_tool_ran()
