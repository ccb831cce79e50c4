"""A Responses request's namespace, custom and hosted tools on their way to an upstream that
speaks chat (and from there Anthropic's Messages), and the calls that come back named as
the client declared them; every ``response`` object made is validated by the openai SDK's
own model of it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response

from gateway.errors import InvalidRequest
from gateway.formats.answer import Answer
from gateway.formats.responses import (
    answer_from_response,
    chat_view,
    input_messages,
    parse_request,
    response_finish_reason,
    response_object,
)
from gateway.formats.responses_to_anthropic import ResponsesToAnthropic
from gateway.formats.responses_to_openai import chat_request, response_from_chat
from gateway.formats.responses_tools import ToolNames, hosted_tools, without_hosted_tools

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch"}}
#: As Codex CLI sends them: top-level functions, a freeform tool, MCP tools in a namespace,
#: and a hosted tool.
CODEX_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "exec_command", "description": "Run a command.",
     "parameters": SCHEMA, "strict": False},
    PATCH,
    {"type": "namespace", "name": "mcp__github", "description": "Tools in the mcp__github "
     "namespace.", "tools": [
         {"type": "function", "name": "create_issue", "description": "Open an issue.",
          "parameters": SCHEMA, "defer_loading": True},
         {"type": "custom", "name": "comment"}]},
    {"type": "web_search", "external_web_access": False},
]


def parse(body: dict[str, Any]) -> dict[str, Any]:
    return parse_request(orjson.dumps({"model": "m", **body}))


def chat_completion(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": name,
                                                                 "arguments": args}}
                    for cid, name, args in calls]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def offered(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The functions the chat upstream is offered, by name."""
    return {t["function"]["name"]: t["function"]
            for t in chat_request(body, "m", 256).get("tools", [])}


def test_namespaced_and_custom_tools_are_offered_as_functions() -> None:
    body, _ = without_hosted_tools(parse({"input": "hi", "tools": CODEX_TOOLS}))
    functions = offered(body)
    assert list(functions) == ["exec_command", "apply_patch", "mcp__github__create_issue",
                               "mcp__github__comment"]
    assert functions["exec_command"] == {"name": "exec_command", "description": "Run a "
                                         "command.", "parameters": SCHEMA, "strict": False}
    # a namespace's function: its own description and schema, defer_loading left out
    assert functions["mcp__github__create_issue"] == {
        "name": "mcp__github__create_issue", "description": "Open an issue.",
        "parameters": SCHEMA}
    # a custom tool: one string, its grammar told in the description
    patch = functions["apply_patch"]
    assert patch["parameters"]["properties"].keys() == {"input"}
    assert patch["parameters"]["required"] == ["input"]
    assert patch["description"] == ("Edit files.\n\nThe input must be written in this Lark "
                                    "grammar:\nstart: begin_patch")
    assert "description" not in functions["mcp__github__comment"]  # none given, none made


def test_an_anthropic_upstream_is_offered_the_same_tools() -> None:
    body, _ = without_hosted_tools(parse({"input": "hi", "tools": CODEX_TOOLS,
                                          "tool_choice": {"type": "custom",
                                                          "name": "apply_patch"}}))
    sent = ResponsesToAnthropic().request(body, "claude", 100)
    assert [t["name"] for t in sent["tools"]] == [
        "exec_command", "apply_patch", "mcp__github__create_issue", "mcp__github__comment"]
    assert sent["tools"][1]["input_schema"]["required"] == ["input"]
    assert sent["tool_choice"] == {"type": "tool", "name": "apply_patch"}


@pytest.mark.parametrize(("tools", "flat"), [
    # a namespace's tool named like a top-level one: the top-level name is kept
    ([{"type": "function", "name": "a__b"},
      {"type": "namespace", "name": "a", "description": "", "tools": [
          {"type": "function", "name": "b"}]}], ["a__b", "a__b_2"]),
    # two namespaces whose names flatten alike
    ([{"type": "namespace", "name": "x.y", "description": "", "tools": [
        {"type": "function", "name": "z"}]},
      {"type": "namespace", "name": "x_y", "description": "", "tools": [
          {"type": "function", "name": "z"}]}], ["x_y__z", "x_y__z_2"]),
    # the default namespace adds no prefix (what OpenAI's models call the top level)
    ([{"type": "namespace", "name": "functions", "description": "", "tools": [
        {"type": "function", "name": "exec"}, {"type": "custom", "name": "patch"}]}],
     ["exec", "patch"]),
])
def test_flattened_names_are_unique(tools: list[dict[str, Any]], flat: list[str]) -> None:
    assert list(offered(parse({"input": "hi", "tools": tools}))) == flat


def test_a_long_or_odd_name_is_cut_to_what_upstreams_accept() -> None:
    long = "n" * 60
    tools = [{"type": "namespace", "name": "mcp__server with spaces", "description": "",
              "tools": [{"type": "function", "name": long},
                        {"type": "function", "name": long + "x"}]}]
    names = list(offered(parse({"input": "hi", "tools": tools})))
    assert len(set(names)) == 2
    for name in names:
        assert len(name) <= 64 and name.replace("_", "").replace("-", "").isalnum()
    assert names[0].startswith("mcp__server_with_spaces__nnn")
    # the same request maps the same way every time (the answer maps back by it)
    again = ToolNames(tools)
    assert [again.flat(long, tools[0]["name"]), again.flat(long + "x", tools[0]["name"])] \
        == names
    assert again.ref(names[1]) is not None and again.ref(names[1]).name == long + "x"


def test_calls_come_back_named_as_declared() -> None:
    request = parse({"input": "hi", "tools": CODEX_TOOLS})
    out = response_from_chat(chat_completion(
        ("c1", "mcp__github__create_issue", '{"cmd":"x"}'),
        ("c2", "apply_patch", '{"input": "*** Begin Patch\\n*** End Patch"}'),
        ("c3", "mcp__github__comment", '{"input": "LGTM"}'),
        ("c4", "exec_command", '{"cmd": "ls"}'),
        ("c5", "made_up", "{}")), request)
    r = Response.model_validate(out)
    calls = [item.model_dump(exclude_none=True, exclude={"id", "status"})
             for item in r.output]
    assert calls == [
        {"type": "function_call", "call_id": "c1", "name": "create_issue",
         "namespace": "mcp__github", "arguments": '{"cmd":"x"}'},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch",
         "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call", "call_id": "c3", "name": "comment",
         "namespace": "mcp__github", "input": "LGTM"},
        {"type": "function_call", "call_id": "c4", "name": "exec_command",
         "arguments": '{"cmd": "ls"}'},
        {"type": "function_call", "call_id": "c5", "name": "made_up", "arguments": "{}"}]
    assert all(item.id.startswith("ctc_" if item.type == "custom_tool_call" else "fc_")
               for item in r.output)
    assert response_finish_reason(out) == "tool_calls"


@pytest.mark.parametrize(("arguments", "text"), [
    ('{"input": "a\\nb"}', "a\nb"),
    ('{"input": "line one\nline two"}', "line one\nline two"),  # a raw newline, as models write
    ('{"patch": "p"}', "p"),  # its one string, under another key
    ('"just a string"', "just a string"),
    ("*** Begin Patch", "*** Begin Patch"),  # not JSON: the text itself
    ('{"input": 3}', '{"input": 3}'),
    ('{"input": "\\ud83d"}', "?"),  # a lone surrogate cannot be sent on: replaced
])
def test_a_custom_calls_text_is_read_from_its_arguments(arguments: str, text: str) -> None:
    request = parse({"input": "hi", "tools": [PATCH]})
    out = response_from_chat(chat_completion(("c", "apply_patch", arguments)), request)
    assert out["output"][0]["input"] == text
    orjson.dumps(out)


def test_earlier_turns_calls_go_up_as_the_functions_offered() -> None:
    body = parse({"tools": CODEX_TOOLS[:3], "input": [
        {"role": "user", "content": "Patch it."},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
         "input": "*** Begin Patch\n"},
        {"type": "function_call", "call_id": "c2", "name": "create_issue",
         "namespace": "mcp__github", "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "#1 "}, {"type": "input_text", "text": "opened"}]},
    ]})
    messages = chat_request(body, "m", 256)["messages"]
    assert messages[1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "apply_patch", "arguments": '{"input":"*** Begin Patch\\n"}'}},
            {"id": "c2", "type": "function", "function": {
                "name": "mcp__github__create_issue", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Done!"},
        {"role": "tool", "tool_call_id": "c2", "content": "#1 opened"}]
    # and to Anthropic: tool_use blocks and their results
    sent = ResponsesToAnthropic().request(body, "claude", 100)
    [use, call] = [b for b in sent["messages"][1]["content"] if b["type"] == "tool_use"]
    assert (use["name"], use["input"]) == ("apply_patch", {"input": "*** Begin Patch\n"})
    assert call["name"] == "mcp__github__create_issue"
    results = [b for b in sent["messages"][2]["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["c1", "c2"]
    # the chat view (cache keys, routing) reads them alike
    assert chat_view(body)["messages"][1:] == messages[1:]


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "custom_tool_call", "name": "p", "input": "x"}, "input[0].call_id"),
    ({"type": "custom_tool_call_output", "output": "x"}, "input[0].call_id"),
])
def test_a_custom_item_without_its_call_id_is_refused_at_the_door(item: dict[str, Any],
                                                                 param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse({"input": [item]})
    assert err.value.param == param


@pytest.mark.parametrize(("body", "param"), [
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "p", "input": 1}]},
     "input[0].input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "p", "arguments": "{}",
                 "namespace": 7}]}, "input[0].namespace"),
    ({"tools": [{"type": "custom"}]}, "tools[0].name"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "xml"}}]},
     "tools[0].format.type"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar"}}]},
     "tools[0].format.syntax"),
    ({"tools": [{"type": "namespace", "name": "n", "tools": []}]}, "tools[0].tools"),
    ({"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
     "tools[0].tools[0].name"),
    ({"tools": [{"type": "namespace", "name": "n", "tools": [
        {"type": "namespace", "name": "m"}]}]}, "tools[0].tools[0].type"),
    ({"tools": [{"type": "magic"}]}, "tools[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),  # hosted, under "refuse"
    ({"tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "custom"}},
     "tool_choice.name"),
])
def test_what_chat_cannot_carry_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        chat_request(parse({"input": "x", **body}), "m", 256)
    assert err.value.status == 400 and err.value.param == param


def test_hosted_tools_are_dropped_and_named() -> None:
    body = parse({"input": "x", "tools": [
        {"type": "web_search"}, {"type": "function", "name": "f"},
        {"type": "image_generation"}, {"type": "web_search"}, {"type": "magic"}]})
    assert hosted_tools(body) == ("web_search", "image_generation")
    kept, dropped = without_hosted_tools(body)
    assert dropped == ("web_search", "image_generation")
    # an unknown type is not dropped: the translation refuses it (it may be one the
    # client runs itself)
    assert kept["tools"] == [{"type": "function", "name": "f"}, {"type": "magic"}]
    assert hosted_tools({"tools": [{"type": ["odd"]}, "x"]}) == ()
    assert body["tools"][0] == {"type": "web_search"}  # the client's body is left as it is
    plain = parse({"input": "x"})
    assert without_hosted_tools(plain) == (plain, ())


@pytest.mark.parametrize(("choice", "sent"), [
    ("auto", {}), ("none", {}),  # nothing offered: nothing to choose from
    (None, {"tool_choice": None}),
])
def test_with_every_tool_dropped_the_choice_goes_too(choice: Any, sent: dict[str, Any]
                                                    ) -> None:
    body, _ = without_hosted_tools(parse({"input": "x", "tools": [{"type": "web_search"}],
                                          "tool_choice": choice,
                                          "parallel_tool_calls": True}))
    out = chat_request(body, "m", 256)
    assert {k: out[k] for k in ("tools", "tool_choice", "parallel_tool_calls")
            if k in out} == sent


def test_a_required_choice_with_every_tool_dropped_is_a_400() -> None:
    body, _ = without_hosted_tools(parse({"input": "x", "tools": [{"type": "web_search"}],
                                          "tool_choice": "required"}))
    with pytest.raises(InvalidRequest) as err:
        chat_request(body, "m", 256)
    assert err.value.param == "tool_choice"


@pytest.mark.parametrize(("choice", "name"), [
    ({"type": "function", "name": "exec_command"}, "exec_command"),
    ({"type": "custom", "name": "apply_patch"}, "apply_patch"),
    ({"type": "function", "name": "create_issue", "namespace": "mcp__github"},
     "mcp__github__create_issue"),
])
def test_a_named_choice_names_the_function_offered(choice: dict[str, Any], name: str) -> None:
    body, _ = without_hosted_tools(parse({"input": "x", "tools": CODEX_TOOLS,
                                          "tool_choice": choice}))
    assert chat_request(body, "m", 256)["tool_choice"] == {"type": "function",
                                                           "function": {"name": name}}


def test_a_response_with_custom_or_namespaced_calls_is_not_cached() -> None:
    request = parse({"input": "hi", "tools": CODEX_TOOLS})
    for name in ("apply_patch", "mcp__github__create_issue"):
        out = response_from_chat(chat_completion(("c", name, '{"input": "x"}')), request)
        assert answer_from_response(out, allow_tools=True) is None
    plain = response_object(Answer(None, "tool_calls", "m", [
        {"id": "c", "type": "function", "function": {"name": "exec_command",
                                                     "arguments": "{}"}}]), body=request)
    assert answer_from_response(plain, allow_tools=True) is not None


def test_the_chat_view_of_a_request_is_lenient() -> None:
    body = parse({"input": [
        {"type": "custom_tool_call", "call_id": "c", "name": 5, "input": ["odd"]},
        {"type": "function_call", "call_id": "d", "name": "f", "namespace": ["x"],
         "arguments": {}}]})
    assert [m["tool_calls"][0]["function"] for m in chat_view(body)["messages"][:1]] == [
        {"name": 5, "arguments": ["odd"]}]
    assert input_messages(body, strict=False)[0]["tool_calls"][1]["function"]["name"] == "f"


#: Codex CLI 0.171's request (its default model): every tool in an ``additional_tools``
#: input item, none in ``tools``; its shell reached through ``exec``, a custom tool in the
#: default namespace ``functions``.
CODEX_LITE: dict[str, Any] = {
    "input": [
        {"type": "additional_tools", "id": "at_1", "role": "developer", "tools": [
            {"type": "namespace", "name": "functions", "description": "", "tools": [
                {"type": "custom", "name": "exec", "description": "Run JavaScript.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/s"}},
                {"type": "function", "name": "wait", "parameters": SCHEMA, "strict": False}]},
            {"type": "namespace", "name": "clock", "description": "Tools in the clock "
             "namespace.", "tools": [{"type": "function", "name": "sleep",
                                      "parameters": SCHEMA, "strict": False}]},
            {"type": "web_search"}]},
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions>read-only</permissions>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Print a marker with the shell."}]}],
    "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
    "reasoning": {"effort": "low", "context": "all_turns"},
    "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
    "text": {"verbosity": "low"}, "client_metadata": {"x": "y"}}


def test_tools_of_additional_tools_items_are_offered_and_named_back() -> None:
    body, dropped = without_hosted_tools(parse(CODEX_LITE))
    assert dropped == ("web_search",)
    assert CODEX_LITE["input"][0]["tools"][-1] == {"type": "web_search"}  # left as it came
    out = chat_request(body, "m", 256)
    assert [t["function"]["name"] for t in out["tools"]] == ["exec", "wait", "clock__sleep"]
    assert (out["tool_choice"], out["parallel_tool_calls"]) == ("auto", False)
    assert out["messages"] == [  # the item itself says nothing
        {"role": "system", "content": "<permissions>read-only</permissions>"},
        {"role": "user", "content": "Print a marker with the shell."}]
    answer = response_from_chat(chat_completion(
        ("c1", "exec", '{"input": "text(await tools.exec_command({cmd: \\"ls\\"}))"}'),
        ("c2", "clock__sleep", "{}")), parse(CODEX_LITE))
    assert [(i["type"], i["name"], i["namespace"]) for i in answer["output"]] == [
        ("custom_tool_call", "exec", "functions"), ("function_call", "sleep", "clock")]
    assert answer["output"][0]["input"] == 'text(await tools.exec_command({cmd: "ls"}))'
    # the next turn: Codex's call and its output (a list of text parts) go up as chat's
    turn = parse({**CODEX_LITE, "input": [*CODEX_LITE["input"], {
        "type": "custom_tool_call", "call_id": "c1", "name": "exec", "namespace": "functions",
        "input": "ls"}, {"type": "custom_tool_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "compat-42\n"}]}]})
    assert chat_request(without_hosted_tools(turn)[0], "m", 256)["messages"][2:] == [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function", "function": {
                "name": "exec", "arguments": '{"input":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "compat-42\n"}]
    # the cache's and the router's view of it counts those tools too
    assert len(chat_view(parse(CODEX_LITE))["tools"]) == 3


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "additional_tools", "role": "developer"}, "input[0].tools"),
    ({"type": "additional_tools", "role": "developer", "tools": {}}, "input[0].tools"),
])
def test_an_additional_tools_item_needs_its_tools(item: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse({"input": [item]})
    assert err.value.param == param


@pytest.mark.parametrize(("tool", "param"), [
    ("exec", "input[0].tools[0]"),
    ({"type": "function"}, "input[0].tools[0].name"),
    ({"type": "magic"}, "input[0].tools[0]"),
])
def test_a_bad_tool_in_an_additional_tools_item_is_a_400(tool: Any, param: str) -> None:
    body = parse({"input": [{"type": "additional_tools", "role": "developer",
                             "tools": [tool]}]})
    with pytest.raises(InvalidRequest) as err:
        chat_request(body, "m", 256)
    assert err.value.param == param
