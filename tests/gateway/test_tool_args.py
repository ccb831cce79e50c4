"""The fakes' agent steering (``x-fake-tool: agent``, gateway/testing/tool_args.py): a real
client's own tool, chosen by name, called with arguments valid for its schema, once; seen by
the official SDKs in each API, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import orjson
import pytest

from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.tool_args import COMMAND, FILE, Tool, arguments, choose, offered, workdir
from tests.conftest import FakeServer

AGENT = {"x-fake-tool": "agent"}
# Claude Code 2.1.197's Bash and Read, trimmed (its descriptions); opencode's bash.
BASH = {"type": "object", "additionalProperties": False, "required": ["command"], "properties": {
    "command": {"type": "string"}, "timeout": {"type": "number"},
    "description": {"type": "string"}, "run_in_background": {"type": "boolean"}}}
READ = {"type": "object", "additionalProperties": False, "required": ["file_path"], "properties": {
    "file_path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
    "limit": {"type": "integer", "exclusiveMinimum": 0}}}
OPENCODE_BASH = {"type": "object", "required": ["command", "description"], "properties": {
    "command": {"type": "string"}, "timeout": {"type": "number"},
    "description": {"type": "string"}}}
OLD_CODEX_SHELL = {"type": "object", "required": ["command"], "properties": {
    "command": {"type": "array", "items": {"type": "string"}},
    "timeout_ms": {"type": "number"}}}
TRICKY = {"type": "object", "required": ["mode", "when", "retries", "ratio", "to", "tags", "x"],
          "$defs": {"Place": {"type": "object", "required": ["city"], "properties": {
              "city": {"type": "string", "minLength": 10}}}},
          "properties": {
              "mode": {"enum": ["fast", "slow"]}, "when": {"anyOf": [{"type": "null"},
                                                                     {"type": "string"}]},
              "retries": {"type": "integer", "minimum": 3, "maximum": 5},
              "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
              "to": {"$ref": "#/$defs/Place"}, "tags": {"type": "array", "minItems": 2,
                                                         "items": {"const": "t"}},
              "x": {"type": ["null", "boolean"]}}}
JS_EXEC = {"type": "custom", "name": "exec", "description": "Run JavaScript code ...",
           "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
CODEX_TOOLS = {"type": "additional_tools", "role": "developer", "tools": [
    {"type": "namespace", "name": "functions", "description": "", "tools": [
        JS_EXEC, {"type": "function", "name": "wait", "parameters": {
            "type": "object", "properties": {"cell_id": {"type": "string"}},
            "required": ["cell_id"]}}]}]}


@pytest.mark.parametrize("schema", [BASH, READ, OPENCODE_BASH, OLD_CODEX_SHELL, TRICKY,
                                    {"type": "object"}, None])
def test_arguments_are_valid_for_the_tools_own_schema(schema: Any) -> None:
    made = orjson.loads(arguments(Tool("t", schema), cwd="/home/dev/project"))
    jsonschema.Draft202012Validator(schema or {}).validate(made)


def test_well_known_arguments_mean_something_to_the_client() -> None:
    assert orjson.loads(arguments(Tool("Bash", BASH))) == {"command": COMMAND}
    assert orjson.loads(arguments(Tool("Read", READ), "/w")) == {"file_path": f"/w/{FILE}"}
    assert orjson.loads(arguments(Tool("shell", OLD_CODEX_SHELL))) == {
        "command": ["bash", "-lc", COMMAND]}
    script = arguments(Tool("exec", custom=True, description="Run JavaScript code"))
    assert "tools.exec_command" in script and COMMAND in script
    assert arguments(Tool("apply_patch", custom=True)).startswith("*** Begin Patch")
    assert arguments(Tool("other", custom=True)) == "compat"
    # a freeform tool a gateway offers as a function of one string (issue 46)
    flattened = Tool("functions__exec", {"type": "object", "properties": {
        "input": {"type": "string"}}}, description="Run JavaScript code")
    assert orjson.loads(arguments(flattened)) == {"input": script}


def test_the_tool_is_chosen_by_preference_else_the_first() -> None:
    tools = [Tool("get_weather"), Tool("Read"), Tool("functions__exec"), Tool("Bash")]
    assert choose(tools).name == "Bash"
    assert choose(tools, ["exec"]).name == "functions__exec"  # a namespace prefix is no bar
    assert choose(tools, ["nope"]).name == "get_weather"
    assert choose([Tool("functions_wait"), Tool("functions_exec")], ["exec"]).name == \
        "functions_exec"
    assert choose([]) is None
    found = offered("responses", {"input": [CODEX_TOOLS], "tools": [
        {"type": "web_search"}, {"type": "function", "name": "f", "parameters": {}}]})
    assert [(t.name, t.custom, t.namespace) for t in found] == [
        ("f", False, None), ("exec", True, "functions"), ("wait", False, "functions")]


@pytest.mark.parametrize(("said", "cwd"), [
    (" - Primary working directory: /home/u/proj\n - Is a git repository: true", "/home/u/proj"),
    ("<environment_context>\n  <cwd>/tmp/w</cwd>", "/tmp/w"),
    ("<env>\n  Working directory: /srv/app\n", "/srv/app"),
    ("no directory here", None)])
def test_the_working_directory_is_the_one_the_client_names(said: str, cwd: str | None) -> None:
    assert workdir({"system": said}, {}) == cwd
    assert workdir({"system": said}, {"x-fake-tool-dir": "/given"}) == "/given"


@pytest.fixture
def oai(fake_server: FakeServer) -> Iterator[openai.OpenAI]:
    fake_server.app.clear()
    with openai.OpenAI(base_url=fake_server.url + "/v1", api_key="k", max_retries=0,
                       default_headers=AGENT) as client:
        yield client


def function(name: str, schema: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def test_chat_calls_the_clients_shell_once(oai: openai.OpenAI) -> None:
    tools: Any = [function("get_weather", READ), function("bash", OPENCODE_BASH)]
    ask: list[Any] = [{"role": "user", "content": "go"}]
    first = oai.chat.completions.create(model="m", messages=ask, tools=tools)
    [call] = first.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "bash"
    assert orjson.loads(call.function.arguments)["command"] == COMMAND
    streamed = oai.chat.completions.create(model="m", messages=ask, tools=tools, stream=True)
    pieces = [d.function.arguments for c in streamed if c.choices
              for d in c.choices[0].delta.tool_calls or () if d.function]
    assert orjson.loads("".join(p or "" for p in pieces))["command"] == COMMAND
    done = [*ask, first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "compat-42"}]
    last = oai.chat.completions.create(model="m", messages=done, tools=tools)
    assert last.choices[0].message.content and not last.choices[0].message.tool_calls


def test_responses_calls_codex_exec_in_its_namespace(oai: openai.OpenAI) -> None:
    ask: Any = [CODEX_TOOLS, {"role": "user", "content": "go"}]
    [call] = oai.responses.create(model="m", input=ask).output
    assert call.type == "custom_tool_call" and call.name == "exec"
    assert call.model_dump()["namespace"] == "functions" and COMMAND in call.input
    with oai.responses.stream(model="m", input=ask) as stream:
        kinds = [event.type for event in stream]
        [streamed] = stream.get_final_response().output
    assert "response.custom_tool_call_input.done" in kinds
    assert streamed.type == "custom_tool_call" and streamed.input == call.input
    result = {"type": "custom_tool_call_output", "call_id": call.call_id,
              "output": [{"type": "input_text", "text": "compat-42"}]}
    last = oai.responses.create(model="m", input=[*ask, call.model_dump(), result])
    assert [item.type for item in last.output] == ["message"]


def test_anthropic_calls_claude_codes_read_in_the_given_directory(
        claude_server: tuple[FakeAnthropic, str]) -> None:
    tools: Any = [{"name": "Read", "description": "read a file", "input_schema": READ},
                  {"type": "web_search_20250305", "name": "web_search"}]
    headers = {**AGENT, "x-fake-tool-prefer": "Read", "x-fake-tool-dir": "/w"}
    ask: list[Any] = [{"role": "user", "content": "read it"}]
    with anthropic.Anthropic(base_url=claude_server[1], api_key="sk-ant-upstream",
                             max_retries=0, default_headers=headers) as client:
        first = client.messages.create(model="c", max_tokens=50, messages=ask, tools=tools)
        use = first.content[-1]
        assert first.stop_reason == "tool_use" and use.type == "tool_use"
        assert (use.name, use.input) == ("Read", {"file_path": f"/w/{FILE}"})
        with client.messages.stream(model="c", max_tokens=50, messages=ask, tools=tools) as s:
            streamed = s.get_final_message().content[-1]
        assert streamed.type == "tool_use" and streamed.input == use.input
        done = [*ask, {"role": "assistant", "content": first.content}, {"role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "x"}]}]
        last = client.messages.create(model="c", max_tokens=50, messages=done, tools=tools)
    assert [block.type for block in last.content] == ["text"] and last.stop_reason == "end_turn"
