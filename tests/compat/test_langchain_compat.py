"""LangChain (install.PYPI's pins) against the gateway, changed in nothing but base URL and
key: ``ChatOpenAI`` on chat completions, ``ChatOpenAI(use_responses_api=True)`` (translated to
chat completions, and served natively) and ``ChatAnthropic``; each invokes a plain prompt,
streams one, and runs a ``bind_tools`` loop: the fake calls ``get_weather`` with arguments
from its schema (tool_args), the tool's ``ToolMessage`` goes back, the model answers
(tests/compat/clients/langchain_client.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.compat.install import Clients
from tests.compat.stack import GATEWAY_KEY, Stack

CLIENT = Path(__file__).parent / "clients" / "langchain_client.py"
#: (the LangChain model: langchain_client.py's KIND, the gateway model: stack.MODELS)
CASES = [("openai", "gpt-compat"), ("openai-responses", "gpt-compat"),
         ("openai-responses", "gpt-compat-native"), ("anthropic", "claude-compat")]


@pytest.mark.parametrize(("kind", "model"), CASES)
def test_langchain_invokes_streams_and_runs_a_tool(stack: Callable[..., Stack],
                                                   clients: Clients, kind: str,
                                                   model: str) -> None:
    s = stack(steer={"x-fake-tool": "agent"})
    base_url = s.url if kind == "anthropic" else f"{s.url}/v1"
    run = s.run([str(clients.python), str(CLIENT), kind, base_url, model],
                s.env(GATEWAY_API_KEY=GATEWAY_KEY, LANGSMITH_TRACING="false"))
    s.assert_finished(run)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    answers = (result["invoke"], result["stream"], result["final"])
    assert all(a.startswith(("w0 w1", "tok0 tok1")) for a in answers), s.report()
    assert [c["args"] for c in result["tool_calls"]] == [{"city": "compat"}], s.report()
    s.assert_tool_ran()
