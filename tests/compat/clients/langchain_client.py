"""LangChain chat models against the gateway; run by the clients' venv (install.PYPI).

``langchain_client.py KIND BASE_URL MODEL``: ``KIND`` ``openai`` (``ChatOpenAI``, chat
completions), ``openai-responses`` (``ChatOpenAI(use_responses_api=True)``) or
``anthropic`` (``ChatAnthropic``, ``BASE_URL`` without /v1); the key is
``GATEWAY_API_KEY``. Three steps: ``invoke`` a plain prompt, ``stream`` one, and a tool loop
with ``bind_tools`` (the model calls ``get_weather``, the tool runs, its ``ToolMessage`` goes
back, the model answers). Prints one JSON line of what each step got; exits non-zero (the
traceback) when one fails or the tool is never called.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"compat-{40 + 2}: sunny in {city}"


def model(kind: str, base_url: str, name: str) -> Any:
    key = os.environ["GATEWAY_API_KEY"]
    if kind == "anthropic":
        from langchain_anthropic import ChatAnthropic
        return ChatAnthropic(model=name, base_url=base_url, api_key=key, max_retries=0)
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(model=name, base_url=base_url, api_key=key, max_retries=0,
                      use_responses_api=kind == "openai-responses")


def text(message: BaseMessage) -> str:
    return str(message.text)


def main(kind: str, base_url: str, name: str) -> None:
    chat = model(kind, base_url, name)
    plain = text(chat.invoke("Say hello."))
    streamed = "".join(str(chunk.text) for chunk in chat.stream("Say hello again."))
    tooled = chat.bind_tools([get_weather])
    messages: list[BaseMessage] = [HumanMessage("What is the weather in Paris?")]
    asked = tooled.invoke(messages)
    if not asked.tool_calls:
        raise SystemExit(f"the model called no tool: {asked!r}")
    messages.append(asked)
    for call in asked.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = text(tooled.invoke(messages))
    print(json.dumps({"invoke": plain, "stream": streamed, "tool_calls": asked.tool_calls,
                      "final": final}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
