"""The checker itself, on bodies written by hand: what the contract allows passes, each kind
of breach fails naming where (so a green harness means the gateway kept the contract, not
that the checker saw nothing)."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.testing.fake_bedrock import FakeBedrock
from gateway.testing.fake_upstream import Record
from tests.gateway.equivalence.bedrock_wire import as_messages_record, wire_error
from tests.gateway.equivalence.builtin import NOW, STRUCTURED
from tests.gateway.equivalence.contract import Allowed, check, responses_tools
from tests.gateway.equivalence.lines import enclosed, is_metadata
from tests.gateway.equivalence.relocation import MARKER

ALLOWED = Allowed(frozenset({"up"}))
RULES = "\n".join(f"Rule {i}: be helpful and precise." for i in range(100))
SYSTEM = f"# Agent\n{NOW}\n{RULES}"
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object",
                                                                     "properties": {}}}}
         for n in ("b", "a")]
DOCS = "\n".join(f"Document [{i}](Title: T{i}) Text {i} was written on May {i}, 2020."
                 for i in range(1, 21))
PROMPT = f"Answer the question.\n\n{DOCS}\n\nQuestion: who?\nAnswer:"


def chat(system: str = SYSTEM, user: Any = "hi", **more: Any) -> dict[str, Any]:
    return {"model": "gpt", "messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": user}], **more}


def upstream(body: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {**body, "model": "up", **more}


def test_the_same_body_with_the_model_mapped_passes_and_another_model_fails():
    assert check("openai", chat(), upstream(chat()), ALLOWED).error is None
    error = check("openai", chat(), {**chat(), "model": "other"}, ALLOWED).error
    assert error is not None and error.startswith("$.model")


def test_types_are_strict_and_the_path_is_named():
    error = check("openai", chat(temperature=1), upstream(chat(temperature=1.0)), ALLOWED).error
    assert error == "$.temperature: client 1, upstream 1.0"
    error = check("openai", chat(), upstream(chat(user="hi!")), ALLOWED).error
    assert error is not None and error.startswith("$.messages[1].content: strings part at "
                                                  "character 2")


def test_tools_sorted_and_a_cache_key_pass_a_changed_tool_fails():
    client = chat(tools=TOOLS)
    sorted_tools = [TOOLS[1], TOOLS[0]]
    ok = upstream(chat(tools=sorted_tools), prompt_cache_key="gw-0123456789abcdef")
    assert check("openai", client, ok, ALLOWED).error is None
    bad = upstream(chat(tools=[TOOLS[1], {**TOOLS[0], "type": "custom"}]))
    assert "the client's tools[0] ('b') is not sent as it was" in str(
        check("openai", client, bad, ALLOWED).error)
    assert "not gw- + 16 hex" in str(
        check("openai", client, upstream(client, prompt_cache_key="mine"), ALLOWED).error)


def test_the_clients_own_cache_key_goes_namespaced_never_as_it_came():
    client = chat(prompt_cache_key="mine")
    namespaced = upstream(client, prompt_cache_key="gwk-" + "0123456789abcdef" * 2)
    assert check("openai", client, namespaced, ALLOWED).error is None
    assert "not namespaced" in str(check("openai", client, upstream(client), ALLOWED).error)
    assert "not namespaced" in str(check("openai", client, upstream(
        client, prompt_cache_key="gw-0123456789abcdef"), ALLOWED).error)


def test_a_stream_gets_the_usage_option_and_nothing_else():
    client = chat(stream=True)
    ok = upstream(client, stream_options={"include_usage": True})
    assert check("openai", client, ok, ALLOWED).error is None
    assert check("openai", client, upstream(client), ALLOWED).error is not None


def moved(system: str, user: str, line: str) -> dict[str, Any]:
    return upstream(chat(system.replace(line + "\n", ""), f"{user}\n\n{MARKER}\n{line}"))


def test_a_clock_line_may_move_to_the_end_after_the_marker():
    verdict = check("openai", chat(), moved(SYSTEM, "hi", NOW), ALLOWED)
    assert (verdict.error, verdict.moved) == (None, [NOW])


def test_the_old_note_fails():
    note = upstream({"model": "gpt", "messages": [
        {"role": "system", "content": SYSTEM.replace(NOW + "\n", "")},
        {"role": "user", "content": "hi"},
        {"role": "user", "content": f"Note from the system prompt: {NOW}"}]})
    error = check("openai", chat(), note, ALLOWED).error
    assert error is not None and "got 3 messages for the client's 2" in error


@pytest.mark.parametrize(("system", "line", "why"), [
    (f"Answer.\n\n{DOCS}", "Document [4](Title: T4) Text 4 was written on May 4, 2020.",
     "inside a structure"),
    (f"# Bot\nWeather: sunny\n{RULES}", "Weather: sunny", "not a metadata line"),
    (f"# Bot\n- Current date: 2024-05-15\n{RULES}", "- Current date: 2024-05-15",
     "inside a structure"),
])
def test_other_lines_may_not_move(system: str, line: str, why: str):
    error = check("openai", chat(system), moved(system, "hi", line), ALLOWED).error
    assert error is not None and why in error, error


def test_a_line_shown_to_change_may_move():
    system = f"# Bot\nWeather: sunny\n{RULES}"
    shown = Allowed(frozenset({"up"}), changing=frozenset({"Weather: sunny"}))
    assert check("openai", chat(system), moved(system, "hi", "Weather: sunny"),
                 shown).error is None


def test_a_cut_sentence_fails():
    cut = upstream(chat(SYSTEM.replace("2024-05-15 ", "")))
    error = check("openai", chat(), cut, ALLOWED).error
    assert error is not None and "changed beyond whole lines" in error


def test_anthropic_markers_up_to_four_in_all():
    client = {"model": "claude", "max_tokens": 8, "system": RULES,
              "messages": [{"role": "user", "content": "hi"}]}
    marked = {**client, "model": "up",
              "system": [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": [
                  {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral",
                                                                   "ttl": "1h"}}]}]}
    verdict = check("anthropic", client, marked, ALLOWED)
    assert (verdict.error, verdict.markers) == (None, 2)
    wrong = {**marked, "system": [{**marked["system"][0], "cache_control": {"type": "x"}}]}
    assert "not an allowed marker" in str(check("anthropic", client, wrong, ALLOWED).error)
    theirs = {**client, "messages": [{"role": "user", "content": [
        {"type": "text", "text": t, "cache_control": {"type": "ephemeral"}}
        for t in ("a", "b", "c", "d")]}]}
    more = {**theirs, "model": "up", "system": marked["system"]}
    assert "more than 4" in str(check("anthropic", theirs, more, ALLOWED).error)


def compressed(kept: list[int], question: str = "Question: who?\nAnswer:") -> str:
    lines = DOCS.split("\n")
    return "Answer the question.\n\n" + "\n".join(lines[i] for i in kept) + "\n\n" + question


@pytest.mark.parametrize(("text", "error"), [
    (compressed([3, 0, 19]), None),
    (compressed([3, 3]), "more often than in the original"),
    (compressed([3]).replace("Text 4", "Txt 4"), "not in the original"),
    (compressed([3], "Question: who?"), "is not kept at the end"),
    (compressed([3]).replace("Answer the", "Answer"), "is not kept at the start"),
])
def test_compression_keeps_whole_units_the_instruction_and_the_question(text: str, error: Any):
    on = Allowed(frozenset({"up"}), compress=True)
    verdict = check("openai", chat(user=PROMPT), upstream(chat(user=text)), on)
    assert (verdict.error is None) if error is None else (error in str(verdict.error)), \
        verdict.error
    assert check("openai", chat(user=PROMPT), upstream(chat(user=text)),
                 ALLOWED).error is not None  # compression off: any change fails


def test_compressed_json_keeps_members_with_their_values():
    on = Allowed(frozenset({"up"}), compress=True)
    text = 'Find it.\n\n{"a": "1",\n "b": "2",\n "c": "3",\n "d": "4"}\n\nKey: "c"'
    ok = 'Find it.\n\n{"a": "1",\n "c": "3"}\n\nKey: "c"'
    bad = 'Find it.\n\n{"a": "1",\n "c": "4"}\n\nKey: "c"'
    assert check("openai", chat(user=text), upstream(chat(user=ok)), on).error is None
    assert "not part of any JSON value" in str(
        check("openai", chat(user=text), upstream(chat(user=bad)), on).error)


def test_the_checkers_own_reading_of_lines():
    assert all(map(is_metadata, [NOW, "Current date: 2024-05-15", "Request ID: 7f3a9c21-0b",
                                 "Today is Wednesday, May 15, 2024.", "Session id: abc123def"]))
    assert not any(map(is_metadata, ["Today is a good day.", "Weather: sunny", "Rule 1: x",
                                     "The current time is unknown."]))
    lines = STRUCTURED.split("\n")
    free = {lines[i] for i in range(len(lines)) if i not in enclosed(STRUCTURED)}
    assert "Current date: 2024-05-15" in free
    assert not {line for line in free if "2024" in line} - {"Current date: 2024-05-15"}


AGENT_TOOLS: list[Any] = [
    {"type": "function", "name": "exec", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch"},
    {"type": "namespace", "name": "mcp__gh", "description": "", "tools": [
        {"type": "function", "name": "create_issue"}, {"type": "custom", "name": "note"}]},
    {"type": "web_search"}, {"type": "image_generation"}, {"type": "web_search"}]
CHAT_NAMES = ["exec", "apply_patch", "mcp__gh__create_issue", "mcp__gh__note"]
DROPPED = "web_search, image_generation"


def offered(*names: str, anthropic: bool = False) -> dict[str, Any]:
    if anthropic:
        return {"tools": [{"name": n, "input_schema": {}} for n in names]}
    return {"tools": [{"type": "function", "function": {"name": n}} for n in names]}


def test_t1_a_translated_responses_request_offers_what_the_client_runs():
    client = {"model": "gpt", "input": "hi", "tools": AGENT_TOOLS}
    assert responses_tools("openai", client, offered(*CHAT_NAMES), DROPPED) is None
    assert responses_tools("anthropic", client, offered(*CHAT_NAMES, anthropic=True),
                           DROPPED) is None
    for received, header, error in [
        (offered(*CHAT_NAMES), None, "x-gateway-dropped-tools"),  # dropped, unsaid
        (offered(*CHAT_NAMES), "web_search", "x-gateway-dropped-tools"),
        (offered(*CHAT_NAMES[:3]), DROPPED, "4 functions expected"),
        (offered("exec", "apply_patch", "x", "x"), DROPPED, "two tools offered under one"),
        (offered("exec2", *CHAT_NAMES[1:]), DROPPED, "a top-level tool's name changed"),
        (offered(*CHAT_NAMES[:3], "mcp gh note"), DROPPED, "a name upstream would refuse"),
    ]:
        assert error in str(responses_tools("openai", client, received, header))
    added = {"model": "gpt", "tools": AGENT_TOOLS[:2], "input": [
        {"type": "additional_tools", "role": "developer", "tools": AGENT_TOOLS[2:]}]}
    assert responses_tools("openai", added, offered(*CHAT_NAMES), DROPPED) is None
    assert "4 functions expected" in str(responses_tools("openai", added,
                                                         offered(*CHAT_NAMES[:2]), DROPPED))
    plain = {"model": "gpt", "input": "hi"}
    assert responses_tools("openai", plain, {"messages": []}, None) is None
    assert "x-gateway-dropped-tools" in str(responses_tools("openai", plain, {}, "web_search"))


def test_t1_a_native_upstream_gets_every_tool_as_it_came():
    client = {"model": "gpt-native", "input": "hi", "tools": AGENT_TOOLS}
    reordered = {**client, "tools": AGENT_TOOLS[::-1]}
    assert responses_tools("responses", client, reordered, None) is None
    assert "every tool as it came" in str(responses_tools(
        "responses", client, {**client, "tools": AGENT_TOOLS[:3]}, None))
    assert "from a native upstream" in str(responses_tools("responses", client, client,
                                                           "web_search"))


def invoked(body: dict[str, Any], action: str = "invoke") -> Record:
    raw = orjson.dumps(body)
    return Record(f"/model/us.anthropic.claude-x-v1%3A0/{action}", "POST",
                  {"x-request-id": "equivalence-0"}, raw, body, 0.0)


def test_b1_an_invoke_model_body_reads_back_as_the_messages_body_it_was():
    client = {"model": "claude-bedrock", "max_tokens": 8, "stream": True, "metadata": {
        "user_id": "u"}, "messages": [{"role": "user", "content": "hi"}]}
    sent = {"max_tokens": 8, "messages": client["messages"],
            "anthropic_version": "bedrock-2023-05-31", "anthropic_beta": ["a-1", "b-2"]}
    back = as_messages_record(invoked(sent, "invoke-with-response-stream"))
    assert back.path == "/v1/messages" and back.headers["anthropic-beta"] == "a-1,b-2"
    assert back.json == {"model": "us.anthropic.claude-x-v1:0", "max_tokens": 8,
                         "messages": client["messages"], "stream": True}
    bedrock = Allowed(frozenset({"us.anthropic.claude-x-v1:0"}), bedrock=True)
    assert check("anthropic", client, back.json, bedrock).error is None
    assert "'metadata' missing upstream" in str(check("anthropic", client, back.json,
                                                       Allowed(bedrock.models)).error)
    whole = as_messages_record(invoked(sent)).json  # not streamed, for a streaming client
    assert "'stream' missing upstream" in str(check("anthropic", client, whole, bedrock).error)


def signed(fake: FakeBedrock, path: str, body: Any) -> Record:
    """A request as the gateway would have sent it, signed with the fake's own key."""
    raw = orjson.dumps(body)
    request = AWSRequest(method="POST", url=f"http://bedrock.test{path}", data=raw,
                         headers={"content-type": "application/json"})
    SigV4Auth(Credentials(fake.access_key, fake.secret_key), "bedrock",
              fake.region).add_auth(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    return Record(path, "POST", {**headers, "host": "bedrock.test"}, raw, body, 0.0)


def test_what_bedrock_would_refuse_whatever_the_client_asked_fails():
    fake, path = FakeBedrock(), "/model/amazon.nova-x-v1%3A0/converse"
    ok = {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}
    assert wire_error(fake, signed(fake, path, ok)) is None
    assert wire_error(fake, None) is None
    unsigned = dataclasses.replace(signed(fake, path, ok), headers={"host": "bedrock.test"})
    assert "MissingAuthenticationToken" in str(wire_error(fake, unsigned))
    other = signed(FakeBedrock(secret_key="another"), path, ok)
    assert "InvalidSignature" in str(wire_error(fake, other))
    tool_use = {"messages": [{"role": "user", "content": [
        {"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}]}
    assert "toolConfig field must be defined" in str(wire_error(fake, signed(fake, path,
                                                                             tool_use)))
    invoke = "/model/us.anthropic.claude-x-v1%3A0/invoke"
    assert "anthropic_version" in str(wire_error(fake, signed(fake, invoke, {"max_tokens": 1})))
    # a client's own bad value, sent as it came: Bedrock's 400 is the client's
    bad_text = {"messages": [{"role": "user", "content": [{"text": None}]}]}
    assert wire_error(fake, signed(fake, path, bad_text)) is None
