"""The policy's ``[translation]`` section: requests translated for an upstream of another
API (an OpenAI client on a Claude model, a Responses client on a chat-only server...).

::

    [translation]
    default_max_tokens = 4096
    hosted_tools = "drop"    # or "refuse"

``hosted_tools``: what a Responses request's hosted tools (``web_search``, ``file_search``,
``code_interpreter``, ``image_generation``, ``mcp``, ...: run by OpenAI itself,
:data:`gateway.formats.responses_tools.HOSTED_TOOLS`) become on their way to an upstream
that cannot run them (served through chat completions or Anthropic's Messages). ``drop``
(the default): left out of what the model is offered, and said so (the answer's
``x-gateway-dropped-tools`` header, the log line's ``dropped_tools``): the agent clients
that offer such tools by default (Codex CLI's ``web_search``, the Agents SDK's hosted
tools) work unchanged on any model, the model answering without them as a model not offered
them would. ``refuse``: a 400 naming the tool, for clients that would rather know. A native
upstream (``native_responses = true``) gets every tool as it came either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.schema import bounded

__all__ = ["TranslationPolicy"]


@dataclass(frozen=True)
class TranslationPolicy:
    """Requests translated between the OpenAI, Anthropic and Responses formats (a client of
    one API calling a model served by another)."""

    #: ``max_tokens`` sent to an Anthropic upstream when the OpenAI client set none (the
    #: Messages API requires it).
    default_max_tokens: int = bounded(4096, ge=1)
    #: A Responses request's hosted tools, to an upstream that cannot run them: ``drop``
    #: (left out, said in ``x-gateway-dropped-tools``) or ``refuse`` (a 400 naming them).
    #: ``drop``: the agent clients that offer them by default then work on any model.
    hosted_tools: Literal["drop", "refuse"] = "drop"
