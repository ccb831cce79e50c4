"""One OpenAI Agents SDK run against the gateway; run by the clients' venv (install.PYPI).

``agents_client.py BASE_URL MODEL API STREAM``: an agent with one function tool,
``get_weather``, on the SDK's Responses model (``API`` ``responses``, the SDK's default) or
its chat completions model (``chat``), run to its final output with ``Runner.run``
(``STREAM`` ``0``) or ``Runner.run_streamed`` (``1``, its events read to the end). The key is
``GATEWAY_API_KEY``. Prints one JSON line: the final output and the tool's calls. Exits
non-zero (the SDK's traceback) when the run fails. The SDK's tracing is off: it would export
to OpenAI.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    calls.append(city)
    return f"compat-{40 + 2}: sunny in {city}"


async def main(base_url: str, model: str, api: str, stream: bool) -> None:
    set_tracing_disabled(True)
    async with AsyncOpenAI(base_url=base_url, api_key=os.environ["GATEWAY_API_KEY"],
                           max_retries=0) as client:
        kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="compat", instructions="Answer briefly; use tools when useful.",
                      model=kind(model=model, openai_client=client), tools=[get_weather])
        question = "What is the weather in Paris?"
        if stream:
            result = Runner.run_streamed(agent, question)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, question)
    print(json.dumps({"final_output": str(result.final_output), "tool_calls": calls}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"))
