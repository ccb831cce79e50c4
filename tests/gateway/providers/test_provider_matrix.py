"""Issue 50's matrix: each client API (OpenAI chat and Responses through the openai SDK,
Anthropic Messages through the anthropic SDK) to each new upstream type (Azure OpenAI's v1
form, Claude on Bedrock InvokeModel, Nova on Bedrock Converse, the Gemini API, Gemini and
Claude on Vertex AI), each on its fake, for what a user sees of five features: a whole
answer, a stream, a tool call and its result, a structured output, and a prompt-cached
conversation.

One gateway serves every cell (module-scoped: six upstreams on three fakes), so the 90
cells take a few seconds. The per-provider modules (test_azure.py, test_bedrock*.py,
test_gemini.py, test_vertex.py) check each provider's wire, auth and errors; this one checks
that no combination is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import anthropic
import jsonschema
import openai
import orjson
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.fake_azure import FakeAzure
from gateway.testing.fake_bedrock import FakeBedrock
from gateway.testing.fake_gemini import FakeGoogle
from gateway.testing.google_tokens import TokenIssuer
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer, LogSink, gateway_toml
from tests.gateway.providers import test_azure, test_gemini, test_vertex
from tests.gateway.providers.bedrock_env import aws_env, bedrock_toml

#: The client-facing model of each upstream variant (the test ids' first part).
UPSTREAMS = {
    "azure": "gpt-azure",  # azure_openai, v1 form, Responses natively (test_azure.upstreams)
    "bedrock-invoke": "claude-bedrock",  # Claude through InvokeModel (bedrock_env)
    "bedrock-converse": "nova",  # amazon.nova-pro through Converse (bedrock_env)
    "gemini": "gem",
    "vertex-gemini": "vertex-gemini",
    "vertex-claude": "vertex-claude",
}
APIS = ("openai", "anthropic", "responses")
CELLS = [pytest.param(model, api, id=f"{name}-{api}")
         for name, model in UPSTREAMS.items() for api in APIS]

TOOL_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "integer"}},
                               "required": ["x"], "additionalProperties": False}
PLACE: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}},
                         "required": ["city", "days"], "additionalProperties": False}
#: A system prompt past every fake's cache threshold (1,024 tokens; Gemini's fake: words).
RULES = "\n".join(f"Rule {i}: answer the traveller about booking change number {i}, in full "
                  "sentences, checking the fare rules first." for i in range(100))


@pytest.fixture(scope="module")
def gw(fake_server: FakeServer, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[GatewayServer]:
    """One gateway with the six upstream variants, each on its fake (credentials in the
    environment as each provider's module sets them)."""
    tmp = tmp_path_factory.mktemp("matrix")
    with ExitStack() as stack, pytest.MonkeyPatch.context() as env:
        azure = FakeAzure(api_key=test_azure.KEY, token=test_azure.TOKEN)
        azure_url = stack.enter_context(ServerThread(azure)).url
        bedrock = FakeBedrock(simulate_cache=True)
        bedrock_url = stack.enter_context(ServerThread(bedrock)).url
        google = FakeGoogle(gemini_key=test_gemini.KEY, simulate_cache=True)
        google_url = stack.enter_context(ServerThread(google)).url
        google.issuer = TokenIssuer.of(google_url + "/token")
        (tmp / "sa.json").write_bytes(orjson.dumps(google.issuer.account))
        (tmp / "entra-token").write_text(test_azure.TOKEN)
        env.setenv(test_azure.KEY_ENV, test_azure.KEY)
        env.setenv(test_gemini.KEY_ENV, test_gemini.KEY)
        env.setenv(test_vertex.SA_ENV, str(tmp / "sa.json"))
        aws_env(env, bedrock, tmp)
        (tmp / "policy.toml").write_text(DEFAULT_POLICY)
        (tmp / "gateway.toml").write_text(gateway_toml(fake_server.url, "".join((
            test_azure.upstreams(azure_url, tmp / "entra-token"),
            bedrock_toml(bedrock_url),
            test_gemini.gemini_toml(google_url),
            test_vertex.vertex_toml(google_url, "google", "gemini-2.5-pro",
                                    name="vertex-g", alias="vertex-gemini"),
            test_vertex.vertex_toml(google_url, "anthropic", test_vertex.CLAUDE,
                                    name="vertex-a", alias="vertex-claude")))))
        sink = LogSink()
        app = create_app(load_config(tmp / "gateway.toml"), request_sink=sink,
                         watch_policy=False)
        srv = stack.enter_context(ServerThread(app))
        yield GatewayServer(srv.url, app.gateway, tmp / "policy.toml", sink, srv)


# -- each client API, as its SDK shows an answer ---------------------------------------------

@dataclass
class Reply:
    """What a user reads of an answer, in the client's own words: ``finish`` (chat's
    finish_reason, Anthropic's stop_reason, Responses' status), the usage's input, output
    and cached input tokens."""

    text: str
    finish: str
    input_tokens: int
    output_tokens: int
    cached: int


#: The finish each API names a complete answer with (Responses: the response's status).
DONE = {"openai": "stop", "anthropic": "end_turn", "responses": "completed"}


class Client:
    """One client API on the gateway through its official SDK (made when first used,
    closed by :meth:`close`), max_retries 0."""

    def __init__(self, api: str, gw: GatewayServer) -> None:
        self.api, self.gw = api, gw
        self.opened: list[openai.OpenAI | anthropic.Anthropic] = []

    @cached_property
    def openai_sdk(self) -> openai.OpenAI:
        self.opened.append(made := openai.OpenAI(base_url=self.gw.v1, api_key="sk-client",
                                                 max_retries=0))
        return made

    @cached_property
    def anthropic_sdk(self) -> anthropic.Anthropic:
        self.opened.append(made := anthropic.Anthropic(base_url=self.gw.url,
                                                       api_key="sk-client", max_retries=0))
        return made

    def close(self) -> None:
        for made in self.opened:
            made.close()

    def ask(self, model: str, turns: list[dict[str, Any]], system: str = "Be brief.",
            **extra: Any) -> Reply:
        """A whole answer to ``turns`` (user/assistant text turns)."""
        if self.api == "openai":
            done = self.openai_sdk.chat.completions.create(
                model=model, messages=[{"role": "system", "content": system}, *turns], **extra)
            usage = done.usage
            assert usage is not None
            details = usage.prompt_tokens_details
            return Reply(done.choices[0].message.content or "", done.choices[0].finish_reason,
                         usage.prompt_tokens, usage.completion_tokens,
                         details.cached_tokens or 0 if details else 0)
        if self.api == "anthropic":
            message = self.anthropic_sdk.messages.create(model=model, max_tokens=256,
                                                     system=system, messages=turns, **extra)
            text = "".join(b.text for b in message.content if b.type == "text")
            u = message.usage
            return Reply(text, message.stop_reason or "", u.input_tokens
                         + (u.cache_read_input_tokens or 0)
                         + (u.cache_creation_input_tokens or 0), u.output_tokens,
                         u.cache_read_input_tokens or 0)
        response = self.openai_sdk.responses.create(model=model, instructions=system,
                                                input=turns, **extra)
        r = response.usage
        assert r is not None
        return Reply(response.output_text, response.status or "", r.input_tokens,
                     r.output_tokens, r.input_tokens_details.cached_tokens)

    def stream(self, model: str, turns: list[dict[str, Any]]) -> tuple[str, str]:
        """The streamed text and the finish the stream ended with."""
        if self.api == "openai":
            chunks = list(self.openai_sdk.chat.completions.create(
                model=model, messages=[{"role": "system", "content": "Be brief."}, *turns],
                stream=True, stream_options={"include_usage": True}))
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
            finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
            return ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                    str(finishes[-1]))
        if self.api == "anthropic":
            with self.anthropic_sdk.messages.stream(model=model, max_tokens=256,
                                                system="Be brief.", messages=turns) as s:
                text = "".join(s.text_stream)
                final = s.get_final_message()
            assert final.usage.output_tokens > 0
            return text, final.stop_reason or ""
        events = list(self.openai_sdk.responses.create(model=model, instructions="Be brief.",
                                                   input=turns, stream=True))
        last = events[-1]
        assert last.type == "response.completed" and last.response.usage is not None
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text == last.response.output_text
        return text, last.response.status or ""


@pytest.fixture
def client(request: pytest.FixtureRequest, gw: GatewayServer) -> Iterator[Client]:
    made = Client(request.node.callspec.params["api"], gw)
    yield made
    made.close()


def hi(text: str = "Hello") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- the five features ----------------------------------------------------------------------

@pytest.mark.parametrize(("model", "api"), CELLS)
def test_a_whole_answer_has_text_and_usage(client: Client, model: str, api: str) -> None:
    reply = client.ask(model, hi())
    assert reply.text.strip() and reply.finish == DONE[api]
    assert reply.input_tokens > 0 and reply.output_tokens > 0


@pytest.mark.parametrize(("model", "api"), CELLS)
def test_a_stream_spells_the_whole_answer_and_ends_as_it(client: Client, model: str,
                                                         api: str) -> None:
    text, finish = client.stream(model, hi())
    assert text and text == client.ask(model, hi()).text
    assert finish == DONE[api]


WEATHER = {"x-fake-tool": "1"}  # the fakes call the request's first tool


@pytest.mark.parametrize(("model", "api"), CELLS)
def test_a_tool_call_comes_back_and_its_result_is_taken(client: Client, model: str,
                                                        api: str) -> None:
    """The model's call in the client's own shape, its arguments valid for the tool's
    schema; the next turn, carrying the result, answers in text."""
    question = hi("Weather in Paris?")
    if api == "openai":
        tools: Any = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather.", "parameters": TOOL_SCHEMA}}]
        done = client.openai_sdk.chat.completions.create(
            model=model, messages=question, tools=tools, extra_headers=WEATHER)
        assert done.choices[0].finish_reason == "tool_calls"
        (call,) = done.choices[0].message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(orjson.loads(call.function.arguments), TOOL_SCHEMA)
        after = client.openai_sdk.chat.completions.create(model=model, tools=tools, messages=[
            *question, done.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}])
        assert after.choices[0].message.content and after.choices[0].finish_reason == "stop"
    elif api == "anthropic":
        atools: Any = [{"name": "get_weather", "description": "The weather.",
                        "input_schema": TOOL_SCHEMA}]
        message = client.anthropic_sdk.messages.create(
            model=model, max_tokens=256, messages=question, tools=atools,
            extra_headers=WEATHER)
        assert message.stop_reason == "tool_use"
        (use,) = [b for b in message.content if b.type == "tool_use"]
        assert use.name == "get_weather"
        jsonschema.validate(use.input, TOOL_SCHEMA)
        after_message = client.anthropic_sdk.messages.create(
            model=model, max_tokens=256, tools=atools, messages=[
                *question, {"role": "assistant", "content": [
                    b.model_dump(exclude_none=True) for b in message.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "sunny, 21 C"}]}])
        assert after_message.stop_reason == "end_turn"
        assert any(b.type == "text" and b.text for b in after_message.content)
    else:
        rtools: Any = [{"type": "function", "name": "get_weather",
                        "description": "The weather.", "parameters": TOOL_SCHEMA,
                        "strict": True}]
        response = client.openai_sdk.responses.create(model=model, input=question, tools=rtools,
                                                  extra_headers=WEATHER)
        (fc,) = [item for item in response.output if item.type == "function_call"]
        assert fc.name == "get_weather"
        jsonschema.validate(orjson.loads(fc.arguments), TOOL_SCHEMA)
        after_response = client.openai_sdk.responses.create(model=model, tools=rtools, input=[
            *question, {"type": "function_call", "call_id": fc.call_id, "name": fc.name,
                        "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id,
             "output": "sunny, 21 C"}])
        assert after_response.status == "completed" and after_response.output_text


@pytest.mark.parametrize(("model", "api"), CELLS)
def test_a_structured_output_is_json_valid_for_the_schema(client: Client, model: str,
                                                          api: str) -> None:
    """OpenAI chat: ``response_format`` json_schema; Responses: ``text.format``; Anthropic:
    ``output_config.format`` (README: each translated or, on Converse, a forced tool)."""
    if api == "openai":
        reply = client.ask(model, hi("Where to?"), response_format={
            "type": "json_schema",
            "json_schema": {"name": "place", "schema": PLACE, "strict": True}})
    elif api == "anthropic":
        reply = client.ask(model, hi("Where to?"), extra_body={
            "output_config": {"format": {"type": "json_schema", "schema": PLACE}}})
    else:
        reply = client.ask(model, hi("Where to?"), text={"format": {
            "type": "json_schema", "name": "place", "schema": PLACE, "strict": True}})
    jsonschema.validate(orjson.loads(reply.text), PLACE)
    assert reply.finish == DONE[api]


@pytest.mark.parametrize(("model", "api"), CELLS)
def test_a_conversations_second_turn_reads_the_cached_prefix(client: Client, model: str,
                                                            api: str) -> None:
    """Two turns on one long system prompt (unique to the cell, so no other test warmed
    it): the second reports the prefix read from the provider's cache, in the client's
    usage (OpenAI ``prompt_tokens_details.cached_tokens``, Anthropic
    ``cache_read_input_tokens``, Responses ``input_tokens_details.cached_tokens``). No
    marker from the client: the prompt_cache stage places them where the provider needs
    them (Claude's cache_control, Converse's cachePoint); Azure and Gemini cache by
    themselves."""
    system = f"Conversation {model}/{api}.\n{RULES}"
    turns = hi("First question?")
    first = client.ask(model, turns, system=system)
    turns += [{"role": "assistant", "content": first.text}, *hi("And the second?")]
    second = client.ask(model, turns, system=system)
    assert first.cached == 0
    assert second.cached >= 1024 and second.cached <= second.input_tokens
