"""Structured outputs and tool calls of a chat request -> the grammar its output must follow.

Pure, no I/O. What the engine serves (OpenAI chat completions' fields):

========================================  ==================================================
``response_format``                       the output
========================================  ==================================================
absent, ``{"type": "text"}``              free text
``{"type": "json_object"}``               a JSON object
``{"type": "json_schema", "json_schema":  a JSON text valid against ``schema`` (``strict``
{"name", "schema", "strict"}}``           or not: the engine always enforces the schema)
========================================  ==================================================

=============================  =============================================================
``tool_choice`` (with tools)   the output
=============================  =============================================================
``"auto"`` (the default)       text (or, with a JSON ``response_format``, that JSON), or one
                               or more calls of the listed functions
``"required"``                 one or more calls
``{"type": "function",         one call of that function
"function": {"name": N}}``
``"none"``                     free text (the tools are not shown to the model)
=============================  =============================================================

Bounds: a string the schema leaves unbounded (no ``maxLength``, ``enum``, ``const``,
``pattern`` or ``format``) is given ``maxLength`` :data:`MAX_STRING`, an array without
``maxItems`` is given :data:`MAX_ITEMS`, an integer or number without bounds is kept within
±:data:`MAX_INTEGER` and a number without ``multipleOf`` to 6 decimal places
(:data:`NUMBER_STEP`), so that a small model looping inside a string, an array or a
number's digits still ends its JSON; the output still validates against the
schema as sent, and a schema that sets its own bounds is followed as it is.

A call's ``arguments`` follow the function's ``parameters`` schema; with
``parallel_tool_calls: false`` there is at most one call. The call syntax is
:mod:`local_engine.tool_calls`'.

Refused with a 400 naming the field (:class:`local_engine.errors.InvalidRequest`): a tool
whose type is not ``function`` (hosted tools: the engine cannot run them), a named function
that is not listed, a schema the grammar library rejects (``param`` is the schema's field;
the message is the library's), a ``response_format`` type it does not know.
Sources: https://platform.openai.com/docs/guides/structured-outputs,
https://platform.openai.com/docs/guides/function-calling
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from local_engine.errors import InvalidRequest
from local_engine.grammar import (
    JSON_OPTIONS,
    Grammar,
    GrammarCompiler,
    GrammarError,
    json_schema_grammar,
    lark_grammar,
)
from local_engine.tool_calls import CALL_SEPARATOR, CALL_SUFFIX, NAME_END

__all__ = ["MAX_INTEGER", "MAX_ITEMS", "MAX_STRING", "NUMBER_STEP", "Structured", "bounded",
           "compile_structured", "parse_structured"]

#: The bounds given to strings and arrays a schema leaves unbounded (characters, items).
MAX_STRING = 64
MAX_ITEMS = 4
MAX_INTEGER = 2**53 - 1  # JSON's interoperable integers (RFC 8259, section 6)
#: The step given to numbers a schema leaves unbounded: at most 6 decimal places, no exponent
#: (a small model otherwise loops in a fraction's digits: "score": 0.12121212... to the end
#: of max_tokens). An output that keeps to it still validates against the schema as sent.
NUMBER_STEP = 1e-6
_NOT_SCHEMAS = {"enum", "const", "default", "examples"}
_BOUNDED_STRING = {"maxLength", "enum", "const", "pattern", "format"}

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Structured:
    """What a request asks of its output's shape: ``grammar`` (llguidance grammar text, None
    for free text), ``functions`` to show the model (OpenAI function objects), whether the
    output is parsed for calls (``calls``), and ``parts``: (param, grammar text) of each
    schema, for naming the one the library rejects."""

    grammar: str | None = None
    functions: tuple[dict[str, Any], ...] = ()
    calls: bool = False
    parts: tuple[tuple[str, str], ...] = ()


def _schema_of(response_format: Any) -> tuple[str, dict[str, Any]] | None:
    """(param, JSON schema) of ``response_format``, None for free text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "response_format", {"type": "object"}
    if kind != "json_schema":
        raise InvalidRequest(f"response_format type {kind!r} is not supported; use 'text', "
                             "'json_object' or 'json_schema'", param="response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest("'json_schema' must be an object with a 'name'",
                             param="response_format.json_schema")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise InvalidRequest("'schema' must be a JSON Schema object",
                             param="response_format.json_schema.schema")
    return "response_format.json_schema.schema", schema


def _functions(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(f"tool type {kind!r} cannot be run by the local engine; it "
                                 "serves 'function' tools only", param=f"tools[{i}].type",
                                 code="unsupported_tool")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not _NAME.match(fn["name"]):
            raise InvalidRequest("a function needs a 'name' of letters, digits, '_' or '-' "
                                 "(at most 64)", param=f"tools[{i}].function.name")
        params = fn.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(params, dict):
            raise InvalidRequest("'parameters' must be a JSON Schema object",
                                 param=f"tools[{i}].function.parameters")
        out.append({k: fn[k] for k in ("name", "description") if k in fn}
                   | {"parameters": params})
    return out


def _chosen(choice: Any, names: list[str]) -> str | None:
    """The tool_choice as "auto" | "required" | "none", or a function's name."""
    if choice is None:
        return "auto"
    if choice in ("auto", "required", "none"):
        return str(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise InvalidRequest(f"tool_choice names the function {name!r}, which is not in "
                                 "'tools'", param="tool_choice.function.name")
        return str(name)
    raise InvalidRequest("'tool_choice' must be 'none', 'auto', 'required' or "
                         "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")


def bounded(schema: Any) -> Any:
    """``schema`` with :data:`MAX_STRING`, :data:`MAX_ITEMS`, ±:data:`MAX_INTEGER`,
    :data:`NUMBER_STEP` and ``additionalProperties: false`` added where it sets no bound (a
    copy; the input is not changed)."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _NOT_SCHEMAS else bounded(v)) for k, v in schema.items()}
    kinds = out.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds and not _BOUNDED_STRING & out.keys():
        out["maxLength"] = MAX_STRING
    numeric = "integer" in kinds or "number" in kinds
    if numeric and not {"maximum", "exclusiveMaximum", "enum", "const"} & out.keys():
        out["maximum"] = MAX_INTEGER
    if numeric and not {"minimum", "exclusiveMinimum", "enum", "const"} & out.keys():
        out["minimum"] = -MAX_INTEGER
    if "number" in kinds and not {"multipleOf", "enum", "const"} & out.keys():
        out["multipleOf"] = NUMBER_STEP
    if "array" in kinds and "maxItems" not in out:
        out["maxItems"] = MAX_ITEMS
    if isinstance(out.get("properties"), dict) and not {"additionalProperties",
                                                         "patternProperties"} & out.keys():
        out["additionalProperties"] = False
    return out


def _json(schema: dict[str, Any]) -> str:
    return "%json" + json.dumps({**bounded(schema), "x-guidance": JSON_OPTIONS})


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid Lark string literal


def parse_structured(body: dict[str, Any]) -> Structured:
    """The :class:`Structured` of a chat request body; raises InvalidRequest (400) naming
    the field. Schemas are translated here; the library's own checks run when the grammar
    is compiled (:meth:`local_engine.grammar.GrammarCompiler.compile`)."""
    fmt = _schema_of(body.get("response_format"))
    tools = body.get("tools")
    functions = _functions(tools) if tools else []
    if "tool_choice" in body and not functions and body["tool_choice"] not in (None, "none",
                                                                                "auto"):
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
    choice = _chosen(body.get("tool_choice"), [f["name"] for f in functions])
    parallel = body.get("parallel_tool_calls", True) is not False
    if not functions or choice == "none":
        if fmt is None:
            return Structured()
        param, schema = fmt
        try:
            return Structured(json_schema_grammar(bounded(schema)), parts=((param, _json(schema)),))
        except GrammarError as exc:
            raise InvalidRequest(f"the schema is not supported: {exc}", param=param,
                                 code="invalid_schema") from exc
    listed = [f for f in functions if choice in ("auto", "required") or f["name"] == choice]
    rules, parts = [], []
    for i, fn in enumerate(listed):
        head = _lark_string('<tool_call>{"name": "' + fn["name"] + NAME_END)
        rules.append(f"call_{i}: {head} {_json(fn['parameters'])} {_lark_string(CALL_SUFFIX)}")
        index = functions.index(fn)
        parts.append((f"tools[{index}].function.parameters", _json(fn["parameters"])))
    calls = ("call" if not parallel or choice not in ("auto", "required")
             else f"call ({_lark_string(CALL_SEPARATOR)} call)*")
    start = "calls"
    if choice == "auto":
        if fmt is not None:
            parts.append((fmt[0], _json(fmt[1])))
            start = f"calls | {_json(fmt[1])}"
        else:
            start = "calls | TEXT"
    lark = "\n".join([f"start: {start}", f"calls: {calls}",
                      "call: " + " | ".join(f"call_{i}" for i in range(len(listed))),
                      *rules, r"TEXT: /[^<](.|\n)*/"])
    try:
        grammar = lark_grammar(lark)
    except GrammarError as exc:
        raise InvalidRequest(f"the tools cannot be served: {exc}", param="tools",
                             code="invalid_schema") from exc
    return Structured(grammar, tuple(functions), True, tuple(parts))


def compile_structured(compiler: GrammarCompiler, structured: Structured) -> Grammar | None:
    """The compiled grammar of ``structured`` (None for free text), from the compiler's
    cache when seen before. Raises InvalidRequest (400, ``invalid_schema``) naming the schema
    the library rejects, with its message."""
    if structured.grammar is None:
        return None
    try:
        return compiler.compile(structured.grammar)
    except GrammarError as exc:
        for param, part in structured.parts:
            problem = compiler.check(lark_grammar(f"start: {part}"))
            if problem:
                problem = problem.splitlines()[0].split(": ", 1)[-1]  # no grammar echo
                raise InvalidRequest(f"the schema is not supported: {problem}", param=param,
                                     code="invalid_schema") from exc
        raise InvalidRequest(f"the output cannot be constrained: {exc}",
                             param="tools" if structured.calls else "response_format",
                             code="invalid_schema") from exc
