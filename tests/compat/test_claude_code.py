"""Claude Code (install.NPM's pin) against the gateway, changed in nothing but its base URL
and key: ``claude -p`` with its default model (claude-opus-4-8 for an API key: the gateway's
``claude-*`` family) and its default tools and betas, on the Anthropic upstream.

The plain prompt must come back as the fake's text; in the tool turn the fake calls one of
Claude Code's own tools (its Bash, with ``echo compat-$((40+2))``; tool_args) and Claude
Code must run it and send its output back before the final text. Nothing reaches the
internet: its auto-updater, telemetry, error reporting and other non-essential traffic are
off, and its home is the test's.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.compat.install import Clients
from tests.compat.stack import GATEWAY_KEY, Stack

AGENT = {"x-fake-tool": "agent"}


def claude(stack: Stack, clients: Clients, prompt: str) -> None:
    env = stack.env(ANTHROPIC_BASE_URL=stack.url, ANTHROPIC_API_KEY=GATEWAY_KEY,
                    DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1",
                    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    run = stack.run([str(clients.claude), "-p", prompt], env)
    stack.assert_finished(run)
    assert "tok0 tok1" in run.stdout, stack.report()  # the fake Anthropic's answer


def test_claude_code_answers_a_plain_prompt(stack: Callable[..., Stack],
                                            clients: Clients) -> None:
    claude(stack(), clients, "Say hello.")


def test_claude_code_runs_its_own_tool_and_answers(stack: Callable[..., Stack],
                                                   clients: Clients) -> None:
    s = stack(steer=AGENT)
    claude(s, clients, "Print a marker with the shell.")
    s.assert_tool_ran()
