"""A JSON Schema (a tool's ``parameters``, a ``json_schema`` response format) as Gemini's
``Schema``: the OpenAPI 3.0 subset ``functionDeclarations[].parameters`` and
``generationConfig.responseSchema`` take. Pure, no I/O.

    gemini_schema(schema, param) -> the Gemini Schema (a dict)

What it does: ``type`` upper-cased (``OBJECT``, ``STRING``...), a type list with ``"null"``
as ``nullable: true`` (several other types: ``anyOf``), ``const`` as a one-value ``enum``,
``oneOf`` as ``anyOf``, ``$ref`` to ``$defs``/``definitions`` inlined (a recursive one: 400);
``properties``, ``items``, ``anyOf`` converted in turn; the keys Gemini knows kept
(``format``, ``title``, ``description``, ``nullable``, ``enum`` of strings, ``required``,
``min/maxItems``, ``min/maxProperties``, ``min/maxLength``, ``pattern``, ``example``,
``default``, ``minimum``, ``maximum``, ``propertyOrdering``); the rest dropped
(``additionalProperties``, ``$schema``, ``strict``, ``examples``...: Gemini's parser
refuses unknown names). ``allOf``: 400.
Source: https://ai.google.dev/api/caching#Schema,
https://ai.google.dev/gemini-api/docs/structured-output
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest

__all__ = ["gemini_schema"]

_KEPT = frozenset({"format", "title", "description", "nullable", "required", "maxItems",
                   "minItems", "minProperties", "maxProperties", "minLength", "maxLength",
                   "pattern", "example", "default", "minimum", "maximum",
                   "propertyOrdering"})
_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object"})
_MAX_DEPTH = 64


def gemini_schema(schema: Any, param: str) -> dict[str, Any]:
    """``schema`` as Gemini's Schema; raises InvalidRequest (400, ``param`` named) for what
    it cannot express."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object", param=param,
                             code="invalid_type")
    defs = {k: v for key in ("definitions", "$defs")
            if isinstance(schema.get(key), dict) for k, v in schema[key].items()}
    return _convert(schema, param, defs, 0)


def _convert(schema: Any, param: str, defs: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise InvalidRequest(f"'{param}' nests (or refers to itself) too deeply for a Gemini "
                             "schema", param=param, code="unsupported_value")
    if not isinstance(schema, dict):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rpartition("/")[2]
        if not isinstance(defs.get(name), dict):
            raise InvalidRequest(f"'{param}': $ref {ref!r} names no $defs entry", param=param,
                                 code="unsupported_value")
        return _convert({**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}},
                        param, defs, depth + 1)
    if "allOf" in schema:
        raise InvalidRequest(f"'{param}': allOf is not supported when the model is served by "
                             "a Gemini upstream", param=param, code="unsupported_value")
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEPT}
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else [k for k in kind or () if isinstance(k, str)]
    if "null" in kinds:
        out["nullable"] = True
        kinds = [k for k in kinds if k != "null"]
    kinds = [k for k in kinds if k in _TYPES]
    if len(kinds) == 1:
        out["type"] = kinds[0].upper()
    elif len(kinds) > 1:
        out["anyOf"] = [{"type": k.upper()} for k in kinds]
    if "const" in schema:
        out["enum"] = [schema["const"]]
    enum = out.get("enum", schema.get("enum"))
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        out["enum"] = enum
        out.setdefault("type", "STRING")
    else:
        out.pop("enum", None)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alternatives, list):
        out["anyOf"] = [_convert(a, param, defs, depth + 1) for a in alternatives]
    properties = schema.get("properties")
    if isinstance(properties, dict):
        out["properties"] = {name: _convert(p, param, defs, depth + 1)
                             for name, p in properties.items()}
        out.setdefault("type", "OBJECT")
    if "items" in schema:
        out["items"] = _convert(schema["items"], param, defs, depth + 1)
        out.setdefault("type", "ARRAY")
    return out
