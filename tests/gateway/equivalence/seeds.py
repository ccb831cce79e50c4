"""The fuzz's seed bodies for each client API (:func:`seeds`): the built-in corpus's requests
in that API's shape, and a few short requests that use every feature a translator reads
(images, documents, tool calls and results, tool choices, output formats, thinking blocks,
cache markers...), so that the mutations of :mod:`.fuzz` land in those shapes often.

A seed is valid for its API: a mutant of it is a request a client could nearly have sent.
"""

from __future__ import annotations

from typing import Any

from tests.gateway.equivalence.builtin import builtin_items
from tests.gateway.equivalence.corpus import MAX_TOKENS, anthropic_body

__all__ = ["responses_body", "seeds"]

PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQK"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_TOOL = {"name": "weather", "description": "Weather now", "parameters": SCHEMA}

_OPENAI: list[tuple[str, dict[str, Any]]] = [
    ("openai images and files", {"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief.",
                                           "prompt_cache_breakpoint": {"ttl": "12h"}}]},
        {"role": "user", "name": "ann", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}",
                                                "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PDF}",
                                      "filename": "a.pdf"}}]}],
        "max_completion_tokens": MAX_TOKENS, "temperature": 0.5, "top_p": 0.9,
        "stop": ["END"], "user": "u-1"}),
    ("openai tool round trip", {"messages": [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1",
         "content": [{"type": "text", "text": "sunny"}]},
        {"role": "user", "content": "And tomorrow?"}],
        "tools": [{"type": "function", "function": {**_TOOL, "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "parallel_tool_calls": False, "max_tokens": MAX_TOKENS, "stream": True,
        "stream_options": {"include_usage": True}}),
    ("openai structured output", {"messages": [{"role": "user", "content": "A city, please."}],
                                  "response_format": {"type": "json_schema", "json_schema": {
                                      "name": "city", "schema": SCHEMA, "strict": True}},
                                  "tool_choice": "auto", "n": 1, "seed": 7,
                                  "max_tokens": MAX_TOKENS}),
]

_ANTHROPIC: list[tuple[str, dict[str, Any]]] = [
    ("anthropic images and documents", {"system": [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                            "data": PDF}, "title": "a"},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": "plain"}},
            {"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": "inner"}]}}]}],
        "max_tokens": MAX_TOKENS, "temperature": 0.5, "top_k": 5,
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"}}),
    ("anthropic tool round trip", {"system": "You call tools.", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call it.", "signature": "sig"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
             "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]}],
        "tools": [{"name": "weather", "description": "Weather now", "input_schema": SCHEMA,
                   "strict": True}],
        "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
        "max_tokens": MAX_TOKENS, "stream": True}),
    ("anthropic structured output", {"messages": [
        {"role": "user", "content": "A city, please."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2",
                                           "name": "weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                      "content": "rain", "is_error": True}]}],
        "tools": [{"type": "custom", "name": "weather", "input_schema": SCHEMA}],
        "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"},
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        "max_tokens": MAX_TOKENS}),
    # Claude Code's, with its default model: a system-role message after the user's turn
    # (the mid-conversation-system beta), adaptive thinking, context management.
    ("anthropic mid-conversation system message", {"system": [
        {"type": "text", "text": "You are a coding agent."},
        {"type": "text", "text": "Use the tools.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_3",
                                               "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_3", "content": "sunny"},
                {"type": "text", "text": "Thanks. And tomorrow?"}]},
            {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]}],
        "tools": [{"name": "weather", "description": "Weather now", "input_schema": SCHEMA}],
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
        "metadata": {"user_id": "u-2"}, "max_tokens": MAX_TOKENS, "stream": True}),
]

_RESPONSES: list[tuple[str, dict[str, Any]]] = [
    ("responses parts and images", {"instructions": "Be brief.", "input": [
        {"type": "message", "role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is in this?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}",
             "detail": "low"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "A pixel.", "annotations": []}]},
        {"role": "user", "content": "Sure?"}],
        "max_output_tokens": MAX_TOKENS, "temperature": 0.5, "top_p": 0.9,
        "metadata": {"a": "b"}, "store": False, "user": "u-1"}),
    ("responses tool round trip", {"input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]}],
        "tools": [{"type": "function", **_TOOL, "strict": True}],
        "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": False, "stream": True}),
    # as Codex CLI sends them: MCP tools in a namespace, a freeform (custom) tool with a
    # grammar, a hosted tool, and the custom tool's call and output on a later turn
    ("responses agent tools", {"instructions": "You are a coding agent.", "input": [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "Sandbox: workspace-write."}]},
        {"role": "user", "content": "Add hello.txt, then file an issue."},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch",
         "input": "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
        {"type": "function_call", "call_id": "call_i", "name": "create_issue",
         "namespace": "mcp__github", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_i", "output": [
            {"type": "input_text", "text": "#1"}]}],
        "tools": [{"type": "function", "name": "exec_command", "strict": False,
                   "parameters": SCHEMA},
                  {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                   "format": {"type": "grammar", "syntax": "lark",
                              "definition": "start: begin_patch hunk+ end_patch"}},
                  {"type": "namespace", "name": "mcp__github", "description": "GitHub.",
                   "tools": [{"type": "function", **_TOOL, "name": "create_issue"},
                             {"type": "custom", "name": "comment"}]},
                  {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": False, "store": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1",
        "stream": True}),
    # Codex CLI 0.171 with its default model: every tool in an additional_tools item
    ("responses additional tools", {"input": [
        {"type": "additional_tools", "role": "developer", "tools": [
            {"type": "namespace", "name": "functions", "description": "", "tools": [
                {"type": "custom", "name": "exec", "description": "Run JavaScript.",
                 "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
                {"type": "function", **_TOOL, "name": "wait", "strict": False}]},
            {"type": "namespace", "name": "clock", "description": "Clock.", "tools": [
                {"type": "function", **_TOOL, "name": "sleep"}]},
            {"type": "web_search"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Run it."}]},
        {"type": "custom_tool_call", "call_id": "call_e", "name": "exec",
         "namespace": "functions", "input": "text(1 + 1)"},
        {"type": "custom_tool_call_output", "call_id": "call_e", "output": [
            {"type": "input_text", "text": "2"}]}],
        "tool_choice": "auto", "parallel_tool_calls": False, "store": False,
        "reasoning": {"effort": "low", "context": "all_turns"},
        "text": {"verbosity": "low"}, "client_metadata": {"k": "v"}}),
    ("responses structured output", {"input": "A city, please.",
                                     "text": {"format": {"type": "json_schema", "name": "city",
                                                         "schema": SCHEMA, "strict": True}},
                                     "tool_choice": "auto", "max_output_tokens": MAX_TOKENS}),
]


def responses_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat request (no ``model``) as a Responses request: the first system message as
    ``instructions``, the others as input items (tool calls and results as
    ``function_call`` and ``function_call_output`` items), tools flattened."""
    out: dict[str, Any] = {}
    items: list[dict[str, Any]] = []
    for message in body["messages"]:
        role, content = message["role"], message.get("content")
        if role == "system" and "instructions" not in out and not items:
            out["instructions"] = content
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": content})
        else:
            if content:
                items.append({"role": role, "content": content})
            for call in message.get("tool_calls") or ():
                items.append({"type": "function_call", "call_id": call["id"],
                              "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
    out["input"] = items
    if body.get("tools"):
        out["tools"] = [{"type": "function", **tool["function"]} for tool in body["tools"]]
    if body.get("max_tokens"):
        out["max_output_tokens"] = body["max_tokens"]
    return out


def seeds(api: str, model: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, body) pairs of ``api`` (``openai``, ``anthropic``, ``responses``, or
    ``count_tokens``: Anthropic's bodies without what only a Messages request takes) for
    ``model``: the built-in corpus, then the feature seeds (three times each)."""
    chat = [(item.name, item.body) for item in builtin_items()]
    # The feature seeds weigh three times: most of what a translator reads is there.
    if api == "openai":
        return [(name, {**body, "model": model}) for name, body in [*chat, *_OPENAI * 3]]
    if api == "responses":
        return [(name, {**body, "model": model}) for name, body in [
            *((n, responses_body(b)) for n, b in chat), *_RESPONSES * 3]]
    out = [(name, anthropic_body(body, model)) for name, body in chat]
    out += [(name, {**body, "model": model}) for name, body in _ANTHROPIC * 3]
    if api == "count_tokens":
        out = [(name, {k: v for k, v in body.items() if k not in _NOT_COUNTED})
               for name, body in out]
    return out


#: Messages fields that count_tokens does not take.
_NOT_COUNTED = frozenset({"max_tokens", "stream", "temperature", "top_k", "top_p",
                          "stop_sequences", "metadata"})
