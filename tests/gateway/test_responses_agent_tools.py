"""/v1/responses with the tools agent clients send by default (Codex CLI: its MCP and agent
tools in ``namespace`` tools, ``apply_patch`` as a custom freeform tool, the hosted
``web_search``), through the gateway to upstreams without the Responses API (the fake's chat
endpoint, the fake Anthropic), with the official openai SDK as the client: the model is
offered functions, its calls come back named as declared, the next turn's call items go up
as the upstream's, and the hosted tool is dropped and said so; a native upstream gets every
tool as it came."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from tests.conftest import DEFAULT_POLICY, GatewayServer

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello\n*** End Patch\n"
SHELL: dict[str, Any] = {"type": "function", "name": "exec_command", "strict": False,
                         "description": "Run a command.", "parameters": {
                             "type": "object", "properties": {"cmd": {"type": "string"}}}}
APPLY_PATCH: dict[str, Any] = {
    "type": "custom", "name": "apply_patch", "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}}
MCP: dict[str, Any] = {"type": "namespace", "name": "mcp__github",
                       "description": "Tools in the mcp__github namespace.", "tools": [
                           {"type": "function", "name": "create_issue", "strict": False,
                            "parameters": {"type": "object",
                                           "properties": {"x": {"type": "integer"}}}}]}
WEB = {"type": "web_search", "external_web_access": False}
NATIVE = """
[upstreams.native]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/v1"
native_responses = true

[models.native]
targets = [{{ upstream = "native", model = "native-upstream-model" }}]
"""


def sdk(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)


def sent(fake: FakeUpstream | FakeAnthropic, i: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(fake.records[i].body)
    return body


def steer(arguments: dict[str, Any]) -> dict[str, str]:
    """The fake calls the first tool it is offered with these arguments."""
    return {"x-fake-tool": "1", "x-fake-tool-args": json.dumps(arguments)}


def test_a_custom_tool_call_round_trip(gw: GatewayServer, fake: FakeUpstream) -> None:
    tools: Any = [APPLY_PATCH, SHELL, MCP, WEB]
    with sdk(gw) as client:
        raw = client.responses.with_raw_response.create(
            model="fake-model", input="Add hello.txt.", tools=tools,
            extra_headers=steer({"input": PATCH}))
        first = raw.parse()
        [call] = first.output
        assert call.type == "custom_tool_call"
        assert (call.name, call.input, call.namespace) == ("apply_patch", PATCH, None)
        second = client.responses.create(model="fake-model", tools=tools, input=[
            {"role": "user", "content": "Add hello.txt."},
            {"type": "custom_tool_call", "call_id": call.call_id, "name": call.name,
             "input": call.input},
            {"type": "custom_tool_call_output", "call_id": call.call_id,
             "output": "Done!"}])
    assert raw.headers["x-gateway-dropped-tools"] == "web_search"
    assert second.output_text == "w0 w1 w2 w3 w4 w5 w6 w7"
    offered = sent(fake, 0)["tools"]
    assert [t["function"]["name"] for t in offered] == [
        "apply_patch", "exec_command", "mcp__github__create_issue"]
    assert offered[0]["function"]["parameters"]["required"] == ["input"]
    assert "Lark grammar" in offered[0]["function"]["description"]
    turn = sent(fake)["messages"]
    assert [m["role"] for m in turn] == ["user", "assistant", "tool"]
    assert turn[1]["tool_calls"] == [{"id": call.call_id, "type": "function", "function": {
        "name": "apply_patch", "arguments": json.dumps({"input": PATCH},
                                                       separators=(",", ":"))}}]
    assert turn[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "Done!"}
    logs = gw.logged(2)
    assert [log["dropped_tools"] for log in logs] == [["web_search"], ["web_search"]]
    assert [log["finish_reason"] for log in logs] == ["tool_calls", "stop"]


def test_a_namespaced_call_streams_back_with_its_namespace(gw: GatewayServer,
                                                          fake: FakeUpstream) -> None:
    tools: Any = [MCP, APPLY_PATCH, WEB]
    with sdk(gw) as client:
        with client.responses.stream(model="fake-model", input="File a bug.", tools=tools,
                                     extra_headers=steer({"x": 1})) as stream:
            added = [e.item for e in stream if e.type == "response.output_item.added"]
            final = stream.get_final_response()
        [call] = final.output
        assert call.type == "function_call"
        assert (call.name, call.namespace, orjson.loads(call.arguments)) == (
            "create_issue", "mcp__github", {"x": 1})
        assert [(i.name, i.namespace) for i in added] == [("create_issue", "mcp__github")]
        # the next turn names it as it came back: the upstream sees its own name again
        client.responses.create(model="fake-model", tools=tools, input=[
            {"role": "user", "content": "File a bug."},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "namespace": call.namespace, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "#1"}])
    assert sent(fake)["messages"][1]["tool_calls"][0]["function"]["name"] == \
        "mcp__github__create_issue"
    assert gw.logged(2)[0]["dropped_tools"] == ["web_search"]


def test_a_custom_calls_text_streams_as_custom_tool_call_input_events(
        gw: GatewayServer, fake: FakeUpstream) -> None:
    with sdk(gw) as client:
        response = client.responses.with_streaming_response.create(
            model="fake-model", input="Add hello.txt.", tools=[APPLY_PATCH, WEB], stream=True,
            extra_headers=steer({"input": PATCH}))
        with response as raw:
            assert raw.headers["x-gateway-dropped-tools"] == "web_search"
            events = list(raw.parse())
    kinds = [e.type for e in events]
    assert "response.custom_tool_call_input.delta" in kinds
    [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
    assert done.input == PATCH
    [item] = events[-1].response.output
    assert (item.type, item.name, item.input) == ("custom_tool_call", "apply_patch", PATCH)


def test_an_anthropic_upstream_gets_the_same_functions_and_calls_come_back(
        with_claude: tuple[GatewayServer, FakeAnthropic]) -> None:
    gw, claude = with_claude
    tools: Any = [MCP, APPLY_PATCH, WEB]
    with sdk(gw) as client:
        first = client.responses.create(model="claude", input="File a bug.", tools=tools,
                                        extra_headers={"x-fake-tool": "1"})
        call = first.output[-1]
        assert call.type == "function_call"
        assert (call.name, call.namespace) == ("create_issue", "mcp__github")
        with client.responses.stream(model="claude", tools=tools, input=[
                {"role": "user", "content": "Patch it."},
                {"type": "custom_tool_call", "call_id": "toolu_1", "name": "apply_patch",
                 "input": PATCH},
                {"type": "custom_tool_call_output", "call_id": "toolu_1", "output": "ok"},
                {"type": "function_call", "call_id": call.call_id, "name": call.name,
                 "namespace": call.namespace, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "#1"},
        ]) as stream:
            final = stream.get_final_response()
    assert final.output_text
    assert [t["name"] for t in sent(claude, 0)["tools"]] == [
        "mcp__github__create_issue", "apply_patch"]
    blocks = [b for m in sent(claude)["messages"] for b in m["content"]
              if isinstance(b, dict) and b["type"] == "tool_use"]
    assert [(b["name"], b["input"]) for b in blocks] == [
        ("apply_patch", {"input": PATCH}), ("mcp__github__create_issue", {"x": 1})]
    assert [log["dropped_tools"] for log in gw.logged(2)] == [["web_search"]] * 2


def test_a_native_upstream_gets_every_tool_as_it_came(
        make_gateway: Callable[..., GatewayServer], fake_server: Any,
        fake: FakeUpstream) -> None:
    gw = make_gateway(NATIVE.format(url=fake_server.url))
    tools: Any = [SHELL, APPLY_PATCH, MCP, WEB]
    with sdk(gw) as client:
        raw = client.responses.with_raw_response.create(model="native", input="Hi",
                                                         tools=tools)
    assert "x-gateway-dropped-tools" not in raw.headers
    assert sent(fake)["tools"] == tools
    assert gw.logged(1)[-1]["dropped_tools"] is None


def test_refused_hosted_tools_and_forced_ones_are_a_400_naming_them(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    refusing = make_gateway(policy=DEFAULT_POLICY + '[translation]\nhosted_tools = "refuse"\n')
    with sdk(refusing) as client, pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="fake-model", input="x", tools=[SHELL, WEB])
    assert err.value.code == "unsupported_tool" and "web_search" in err.value.message
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "tools[1]"
    with sdk(make_gateway()) as client, pytest.raises(openai.BadRequestError) as forced:
        client.responses.create(model="fake-model", input="x", tools=[SHELL, WEB],
                                tool_choice={"type": "web_search_preview"})
    assert forced.value.code == "unsupported_tool" and "web_search_preview" in \
        forced.value.message
    assert fake.records == []


#: Codex CLI 0.171's request with its default model: every tool in an ``additional_tools``
#: input item (none in ``tools``), grouped in namespaces; its shell reached through the
#: custom tool ``exec`` (JavaScript) in the default namespace ``functions``.
LITE_TOOLS: Any = {"type": "additional_tools", "role": "developer", "tools": [
    {"type": "namespace", "name": "functions", "description": "", "tools": [
        {"type": "custom", "name": "exec", "description": "Run JavaScript.", "format": {
            "type": "grammar", "syntax": "lark", "definition": "start: /.+/s"}},
        {"type": "function", "name": "wait", "strict": False,
         "parameters": {"type": "object", "properties": {}}}]},
    {"type": "namespace", "name": "collaboration", "description": "Agents.", "tools": [
        {"type": "function", "name": "spawn_agent", "strict": False,
         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]},
    WEB]}
SCRIPT = 'text(await tools.exec_command({cmd: "echo compat-$((40+2))"}))'


def lite(client: openai.OpenAI, model: str, *items: Any, **more: Any) -> Any:
    return client.responses.create(
        model=model, input=[LITE_TOOLS, {"role": "user", "content": "Run it."}, *items],
        tool_choice="auto", parallel_tool_calls=False, store=False,
        include=["reasoning.encrypted_content"], **more)


@pytest.mark.parametrize("streamed", [False, True])
def test_codex_cli_default_request_round_trip_over_chat(gw: GatewayServer, fake: FakeUpstream,
                                                        streamed: bool) -> None:
    with sdk(gw) as client:
        first = lite(client, "fake-model", stream=streamed,
                     extra_headers=steer({"input": SCRIPT}))
        if streamed:
            events = list(first)
            assert "response.custom_tool_call_input.delta" in [e.type for e in events]
            first = events[-1].response
        [call] = first.output
        assert (call.type, call.name, call.namespace, call.input) == (
            "custom_tool_call", "exec", "functions", SCRIPT)
        second = lite(client, "fake-model", call.model_dump(exclude_none=True), {
            "type": "custom_tool_call_output", "call_id": call.call_id,
            "output": [{"type": "input_text", "text": "compat-42\n"}]})
    assert second.output_text == "w0 w1 w2 w3 w4 w5 w6 w7"
    first_sent, second_sent = sent(fake, 0), sent(fake)
    assert [t["function"]["name"] for t in first_sent["tools"]] == [
        "exec", "wait", "collaboration__spawn_agent"]
    assert second_sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call.call_id, "type": "function", "function": {
                "name": "exec", "arguments": json.dumps({"input": SCRIPT},
                                                        separators=(",", ":"))}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "compat-42\n"}]
    assert [log["dropped_tools"] for log in gw.logged(2)] == [["web_search"]] * 2


def test_codex_cli_default_request_on_anthropic_and_native_upstreams(
        with_claude: tuple[GatewayServer, FakeAnthropic], fake_server: Any,
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw, claude = with_claude
    with sdk(gw) as client:
        r = lite(client, "claude", extra_headers={"x-fake-tool": "1"})
    [call] = [item for item in r.output if item.type != "message"]
    assert (call.type, call.name, call.namespace) == ("custom_tool_call", "exec", "functions")
    assert [t["name"] for t in sent(claude)["tools"]] == [
        "exec", "wait", "collaboration__spawn_agent"]
    native = make_gateway(NATIVE.format(url=fake_server.url))
    with sdk(native) as client:
        lite(client, "native")
    assert sent(fake)["input"][0] == LITE_TOOLS  # as it came, the hosted tool included
