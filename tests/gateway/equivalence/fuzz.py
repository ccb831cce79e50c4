"""A deterministic fuzz corpus (seeded ``random``, no hypothesis): mutations of valid bodies,
and the suite's existing bad-body cases.

:func:`mutants` mutates seed bodies (valid requests of one API: :mod:`.seeds`) one to three
times each: fields dropped or duplicated (a duplicate key in the raw JSON too), a wrong JSON
type, null, huge, negative or fractional numbers, empty strings, lists and objects at any
path, unknown roles (of messages and of Responses input items), a ``type`` (of a block, part,
item, tool, source...) swapped for another API's, a top-level field of any of the three APIs
set to a value it might take (:data:`FIELDS`), deeply nested garbage, unicode (astral,
right-to-left, NUL, zero-width, a lone surrogate escaped in the JSON), very long lines, and
raw damage: non-JSON bytes, truncated JSON. :func:`known_bad_bodies` reads the bad-body
cases that tests/gateway/test_proxy.py (OpenAI, and Responses) and
tests/gateway/formats/test_anthropic.py (Anthropic, and count_tokens) parametrize, so new
ones join here by themselves.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["deep_bodies", "known_bad_bodies", "mutants"]

Path = tuple[Any, ...]

ROLES = ["robot", "", "SYSTEM", "function", "developer", "tool", "system", "assistant", None, 7,
         ["user"], "user\u0000"]
UNICODE = ["\U0001f600\U0001f680 emoji", "\u05e9\u05dc\u05d5\u05dd right to left",
           "nul \u0000 inside", "zero\u200dwidth\u200bjoiners", "e\u0301 combining",
           "\ufeffbom", "line\u2028separator", "tab\tand\r\ncrlf", "\\u escaped \\ud800 text"]
#: Type names of the three APIs' blocks, parts, items, tools, sources and choices.
TYPES = ["text", "image", "document", "tool_use", "tool_result", "thinking",
         "redacted_thinking", "image_url", "input_audio", "file", "refusal", "function",
         "custom", "message", "function_call", "function_call_output", "reasoning",
         "input_text", "output_text", "input_image", "input_file", "base64", "url", "content",
         "auto", "any", "none", "tool", "required", "json_schema", "json_object", "web_search",
         "enabled", "disabled", "ephemeral", "search_result", "unknown_type", ""]
#: Top-level fields of the three APIs and values each might take, valid or nearly.
FIELDS: dict[str, list[Any]] = {
    "stream": [True, False], "stream_options": [{"include_usage": True}, {"include_usage": 1}],
    "tool_choice": ["auto", "required", "none", {"type": "any"}, {"type": "tool"},
                    {"type": "function", "name": "weather"}, {"type": "function"},
                    {"type": "function", "function": {}}, {"type": "tool", "name": 3}],
    "response_format": [{"type": "json_object"}, {"type": "json_schema"}, {"type": "text"},
                        {"type": "json_schema", "json_schema": {"name": "x"}}],
    "text": [{"format": {"type": "json_schema"}}, {"format": "json"}, {"verbosity": "low"},
             {"format": {"type": "json_object"}}],
    "thinking": [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}, "on"],
    "output_config": [{"effort": "low"}, {"format": {"type": "json_schema"}}, {"format": 1}],
    "reasoning": [{"effort": "high"}, {"summary": "auto"}],
    "previous_response_id": ["resp_123", ""], "store": [True, False],
    "instructions": ["Be brief.", ""], "system": ["Be brief.", [{"type": "text"}]],
    "metadata": [{"user_id": 5}, {"user_id": "u"}], "user": ["u", 7],
    "parallel_tool_calls": [False, True, "no"], "n": [2, 1], "logprobs": [True],
    "top_logprobs": [3], "prompt_cache_key": ["k", 5], "service_tier": ["auto", 1],
    "stop": ["END", ["a", "b"], [1]], "stop_sequences": [["END"], "END"],
    "modalities": [["text", "audio"], "text"], "container": ["c"], "mcp_servers": [[{}]],
    "inference_geo": ["us"], "seed": [1], "max_tool_calls": [2], "truncation": ["auto"],
    "conversation": ["conv_1"], "prompt": [{"id": "p"}], "include": [["reasoning"]],
    "functions": [[{"name": "f"}]], "function_call": ["auto"], "audio": [{"voice": "x"}],
}
NUMBERS = [0, -1, -(10 ** 20), 10 ** 30, 2 ** 64, 2 ** 63, 1e308, -1e308, 0.5, 1e-300, 3.0]


def paths(value: Any, at: Path = ()) -> Iterator[Path]:
    """Every path in a parsed JSON value, the value itself first."""
    yield at
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from paths(inner, (*at, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from paths(inner, (*at, i))


def _get(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: Path, new: Any) -> Any:
    if not path:
        return new
    _get(value, path[:-1])[path[-1]] = new
    return value


def _other_type(rng: random.Random, old: Any) -> Any:
    choices: list[Any] = ["a string", 42, 4.5, True, False, None, [], {}, ["x", 1],
                          {"type": "text", "text": "x"}]
    return rng.choice([c for c in choices if type(c) is not type(old)] or choices)


def _nest(rng: random.Random) -> Any:
    depth = rng.choice([20, 100, 200])  # deeper: deep_bodies
    value: Any = rng.choice(["deep", 1, None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


# -- mutations of a parsed body: (name, body) -> name of what was done ---------------------

def _drop(rng: random.Random, body: Any) -> tuple[str, Any]:
    path = rng.choice([p for p in paths(body) if p])
    container = _get(body, path[:-1])
    del container[path[-1]]
    return f"drop {list(path)}", body


def _duplicate(rng: random.Random, body: Any) -> tuple[str, Any]:
    lists = [p for p in paths(body) if isinstance(_get(body, p), list) and _get(body, p)]
    if not lists:
        return _drop(rng, body)
    path = rng.choice(lists)
    items = _get(body, path)
    i = rng.randrange(len(items))
    items.insert(i, json.loads(json.dumps(items[i])))
    return f"duplicate {list(path)}[{i}]", body


def _retype(rng: random.Random, body: Any) -> tuple[str, Any]:
    path = rng.choice(list(paths(body)))
    new = _other_type(rng, _get(body, path))
    return f"{list(path)} = {json.dumps(new)[:40]}", _set(body, path, new)


def _null(rng: random.Random, body: Any) -> tuple[str, Any]:
    path = rng.choice([p for p in paths(body) if p])
    return f"{list(path)} = null", _set(body, path, None)


def _number(rng: random.Random, body: Any) -> tuple[str, Any]:
    keys = ["max_tokens", "temperature", "top_p", "top_k", "n", "max_completion_tokens",
            "presence_penalty", "seed", "max_output_tokens", "top_logprobs"]
    numeric = [p for p in paths(body) if isinstance(_get(body, p), (int, float))
               and not isinstance(_get(body, p), bool)]
    if numeric and (rng.random() < 0.5 or not isinstance(body, dict)):
        path = rng.choice(numeric)
    elif isinstance(body, dict):
        path = (rng.choice(keys),)
    else:
        return _retype(rng, body)
    new = rng.choice(NUMBERS)
    return f"{list(path)} = {new!r}", _set(body, path, new)


def _empty(rng: random.Random, body: Any) -> tuple[str, Any]:
    path = rng.choice([p for p in paths(body) if p])
    new = rng.choice(["", [], {}])
    return f"{list(path)} = {json.dumps(new)}", _set(body, path, new)


def _role(rng: random.Random, body: Any) -> tuple[str, Any]:
    field = "input" if isinstance(body, dict) and "input" in body else "messages"
    messages = body.get(field) if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return _retype(rng, body)
    i = rng.randrange(len(messages))
    role = rng.choice(ROLES)
    if isinstance(messages[i], dict):
        messages[i]["role"] = role
    return f"{field}[{i}].role = {json.dumps(role)}", body


def _kind(rng: random.Random, body: Any) -> tuple[str, Any]:
    """A ``type`` (of a block, a part, an item, a tool, a source, a choice...) becomes
    another one that some API knows: a shape a translator reads with the wrong fields."""
    typed = [p for p in paths(body) if p and p[-1] == "type"]
    if not typed:
        return _retype(rng, body)
    path = rng.choice(typed)
    new = rng.choice(TYPES)
    return f"{list(path)} = {json.dumps(new)}", _set(body, path, new)


def _garbage(rng: random.Random, body: Any) -> tuple[str, Any]:
    containers = [p for p in paths(body) if isinstance(_get(body, p), (dict, list))]
    path = rng.choice(containers)
    target = _get(body, path)
    if isinstance(target, dict):
        target[rng.choice(["garbage", "messages", "tools", "extra_field"])] = _nest(rng)
    else:
        target.insert(rng.randrange(len(target) + 1), _nest(rng))
    return f"nested garbage in {list(path)}", body


def _field(rng: random.Random, body: Any) -> tuple[str, Any]:
    """A top-level field of one of the APIs, set to a value it might take (or a wrong type):
    fields the seeds leave out reach the translators too."""
    if not isinstance(body, dict):
        return _retype(rng, body)
    key = rng.choice(list(FIELDS))
    new = rng.choice(FIELDS[key]) if rng.random() < 0.8 else _other_type(rng, None)
    body[key] = json.loads(json.dumps(new))
    return f"[{key!r}] = {json.dumps(new)[:40]}", body


def _strings(body: Any) -> list[Path]:
    return [p for p in paths(body) if isinstance(_get(body, p), str)]


def _unicode(rng: random.Random, body: Any) -> tuple[str, Any]:
    found = _strings(body)
    if not found:
        return _retype(rng, body)
    path = rng.choice(found)
    text = rng.choice(UNICODE)
    old = _get(body, path)
    new = rng.choice([text, old + text, text + old])
    return f"{list(path)} with {text[:12]!r}", _set(body, path, new)


def _long_line(rng: random.Random, body: Any) -> tuple[str, Any]:
    found = _strings(body)
    if not found:
        return _retype(rng, body)
    path = rng.choice(found)
    size = rng.choice([20_000, 200_000, 1_200_000])  # the last is over max_body_bytes
    return f"{list(path)} + a {size}-character line", \
        _set(body, path, _get(body, path) + "x" * size)


PARSED: list[Callable[[random.Random, Any], tuple[str, Any]]] = [
    _drop, _duplicate, _retype, _null, _number, _empty, _role, _garbage, _unicode, _retype,
    _drop, _unicode, _long_line, _kind, _kind, _field, _field]


# -- raw damage --------------------------------------------------------------------------

def _raw(rng: random.Random, raw: bytes) -> tuple[str, bytes]:
    kind = rng.randrange(6)
    if kind == 0:
        cut = rng.randrange(len(raw))
        return f"truncated at byte {cut}", raw[:cut]
    if kind == 1:
        return "random bytes", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 2:  # a duplicate key, the later one wins in every parser the gateway uses
        key = rng.choice([b"model", b"messages", b"stream", b"max_tokens", b"system",
                          b"input", b"tools"])
        value = rng.choice([b'"gpt"', b"null", b"[]", b"true", b"1"])
        return f"duplicate key {key.decode()!r}", raw[:-1] + b', "' + key + b'": ' + value + b"}"
    if kind == 3:  # a lone surrogate, escaped
        return "a lone surrogate", raw.replace(b'"content": "', b'"content": "\\ud800', 1)
    if kind == 4:
        return "not JSON", rng.choice([b"", b"null", b"[]", b"{}", b"{'model': 'gpt'}",
                                       b"\xff\xfe{}", b'{"max_tokens": NaN}', b"nul", b"{,}"])
    return "trailing garbage", raw + rng.choice([b"}", b" x", b"\x00", b"{}"])


def mutants(seeds: list[tuple[str, dict[str, Any]]], count: int, seed: int
            ) -> Iterator[tuple[str, bytes]]:
    """``count`` fuzzed bodies, (name, raw bytes), from the seed (name, body) pairs."""
    rng = random.Random(seed)
    for n in range(count):
        name, body = seeds[n % len(seeds)]
        body = json.loads(json.dumps(body))
        done = []
        if rng.random() < 0.12:
            what, raw = _raw(rng, json.dumps(body).encode())
            done.append(what)
        else:
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                if not body or not isinstance(body, (dict, list)):
                    break  # a mutation made it a scalar or emptied it: enough
                what, body = rng.choice(PARSED)(rng, body)
                done.append(what)
            raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8",
                                                                           "surrogatepass")
        yield f"fuzz #{n} ({name}): {'; '.join(done)[:300]}", raw


def deep_bodies(name: str, body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """``body`` with a value nested past what orjson writes (254 levels) and past what it
    reads (1,024): the random mutants stay under both (each 5xx stalls the gateway's loop
    while it logs the traceback)."""
    out = []
    for depth in (300, 1100):
        nested = b"[" * depth + b'"deep"' + b"]" * depth
        raw = json.dumps(body).encode()[:-1] + b', "extra_field": ' + nested + b"}"
        out.append((f"{name} with a value nested {depth} levels deep", raw))
    return out


def known_bad_bodies(api: str, model: str) -> list[bytes]:
    """The raw bodies of the suite's bad-request tests for ``api`` (read from their
    parametrize marks, so the two stay one list): OpenAI's for Responses (none has an
    ``input``), Anthropic's for count_tokens; as written, then for ``model``, so that they
    get past the model."""
    module, test = {"openai": ("tests.gateway.test_proxy", "test_bad_requests_get_openai_errors"),
                    "anthropic": ("tests.gateway.formats.test_anthropic",
                                  "test_invalid_bodies_are_rejected_naming_the_field")}[
        {"responses": "openai", "count_tokens": "anthropic"}.get(api, api)]
    function = getattr(importlib.import_module(module), test)
    out = []
    for mark in getattr(function, "pytestmark", ()):
        if mark.name == "parametrize":
            out += [case[0] if isinstance(case, tuple) else case.values[0]
                    for case in mark.args[1]]
    bodies = [raw for raw in out if isinstance(raw, bytes)]
    ours = json.dumps(model).encode()
    return bodies + [raw.replace(b'"fake-model"', ours).replace(b'"claude-x"', ours)
                     for raw in bodies]
