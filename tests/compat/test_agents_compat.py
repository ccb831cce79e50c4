"""The OpenAI Agents SDK (install.PYPI's pin) against the gateway, changed in nothing but its
client's base URL and key: an agent with one function tool, on the SDK's Responses model
(its default) and on its chat completions model, run with ``Runner.run`` and streamed with
``Runner.run_streamed``, each on the upstreams the gateway can send it to (Responses: served
natively, translated to chat completions, translated to Anthropic; chat: as is, translated
to Anthropic). The fake calls the tool (tool_args picks it: the only one) with arguments
from its schema, the SDK runs it and sends its output back, and the run ends on the fake's
text (tests/compat/clients/agents_client.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.compat.install import Clients
from tests.compat.stack import GATEWAY_KEY, Stack

CLIENT = Path(__file__).parent / "clients" / "agents_client.py"
#: (the SDK's model class, the gateway model: see stack.MODELS for its upstream)
CASES = [("responses", "gpt-compat"), ("responses", "gpt-compat-native"),
         ("responses", "claude-compat"), ("chat", "gpt-compat"), ("chat", "claude-compat")]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize(("api", "model"), CASES)
def test_agents_sdk_runs_its_tool_and_answers(stack: Callable[..., Stack], clients: Clients,
                                              api: str, model: str, streamed: bool) -> None:
    s = stack(steer={"x-fake-tool": "agent"})
    run = s.run([str(clients.python), str(CLIENT), f"{s.url}/v1", model, api,
                 "1" if streamed else "0"],
                s.env(GATEWAY_API_KEY=GATEWAY_KEY, OPENAI_AGENTS_DISABLE_TRACING="1"))
    s.assert_finished(run)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["tool_calls"] == ["compat"], s.report()
    assert result["final_output"].startswith(("w0 w1", "tok0 tok1")), s.report()
    s.assert_tool_ran()
