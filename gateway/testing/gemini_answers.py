"""What the fake Google (:mod:`gateway.testing.fake_gemini`) answers a ``generateContent``
request: its checks, its answer, the answer as ``streamGenerateContent?alt=sse`` events,
and Gemini's implicit prompt caching. Pure but for the cache's memory.

- :func:`validate_request`: the GenerateContentRequest as strictly as Google's parser takes
  it (unknown field names refused as ``Invalid JSON payload received. Unknown name``; roles
  ``user``/``model``; one data field per part; function calls with an object ``args``, their
  responses with a name and an object ``response``; a ``responseSchema`` only with
  ``responseMimeType: application/json``, and none of JSON Schema's keys Gemini's Schema
  lacks, such as ``additionalProperties``): :class:`~gateway.testing.google_tokens.GoogleError`
  400 INVALID_ARGUMENT naming the field, so a translator bug fails loudly.
- :func:`answer`: the GenerateContentResponse the headers ask for (as the other fakes:
  ``x-fake-tokens`` words ``tok0 ...``, cut by ``maxOutputTokens`` with ``MAX_TOKENS``; a
  JSON instance of ``responseSchema``; ``x-fake-tool`` a ``functionCall`` of the first
  declared function with ``{"x": 1}``, ``once``: while no functionResponse is in the
  contents; ``x-fake-finish``: the finishReason, ``SAFETY`` with a blocked rating;
  ``x-fake-block``: the prompt blocked, no candidate); usage counts words.
- :func:`events`: the answer as the stream sends it: a chunk per word, the function call
  whole, the last chunk carrying ``finishReason`` and the final ``usageMetadata``.
- :class:`ImplicitCache`: Gemini 2.5's implicit caching: a request whose prompt begins with
  a prefix (systemInstruction, tools, then contents part by part) sent before, of at least
  ``min_tokens`` (1,024 as for 2.5 Flash; words here), reports it as
  ``cachedContentTokenCount`` (https://ai.google.dev/gemini-api/docs/caching#implicit-caching).

Sources: https://ai.google.dev/api/generate-content, https://ai.google.dev/api/caching#Content
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.testing.fake_responses import json_instance
from gateway.testing.google_tokens import GoogleError

__all__ = ["ImplicitCache", "answer", "events", "prompt_words", "validate_request"]

_TOP = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
        "safetySettings", "cachedContent", "labels"}
_PART = {"text", "inlineData", "fileData", "functionCall", "functionResponse",
         "executableCode", "codeExecutionResult"}
_PART_EXTRA = {"thought", "thoughtSignature", "videoMetadata"}
_CONFIG = {"stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema",
           "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed",
           "presencePenalty", "frequencyPenalty", "responseLogprobs", "logprobs",
           "thinkingConfig", "responseModalities", "mediaResolution", "speechConfig"}
_SCHEMA = {"type", "format", "title", "description", "nullable", "enum", "maxItems",
           "minItems", "properties", "required", "minProperties", "maxProperties",
           "minLength", "maxLength", "pattern", "example", "anyOf", "propertyOrdering",
           "default", "items", "minimum", "maximum"}
_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT"}
_NUMBERS: dict[str, Any] = {"maxOutputTokens": int, "candidateCount": int, "topK": (int, float),
                            "seed": int, "temperature": (int, float), "topP": (int, float),
                            "presencePenalty": (int, float),
                            "frequencyPenalty": (int, float)}
_RANGES = {"maxOutputTokens": (1, 2**31 - 1), "temperature": (0, 2), "topP": (0, 1),
           "candidateCount": (1, 8), "topK": (1, 2**31 - 1)}
_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}$")


def _bad(message: str) -> GoogleError:
    return GoogleError(400, message)


def _unknown(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _bad(f'Invalid JSON payload received. Unknown name "{key}" at '
                       f"'{where}': Cannot find field.")


def validate_request(data: dict[str, Any]) -> None:
    """Raises GoogleError 400 for what Google's API refuses (module docstring)."""
    _unknown(data, _TOP, "")
    contents = data.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _bad("* GenerateContentRequest.contents: contents is not specified")
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role") not in ("user", "model"):
            raise _bad(f"contents[{i}].role: Please use a valid role: user, model.")
        _parts(content.get("parts"), f"contents[{i}]")
    if "systemInstruction" in data:
        _parts((data["systemInstruction"] or {}).get("parts"), "system_instruction")
    for i, tool in enumerate(data.get("tools") or ()):
        for j, function in enumerate(tool.get("functionDeclarations") or ()):
            where = f"tools[{i}].function_declarations[{j}]"
            _unknown(function, {"name", "description", "parameters", "response"}, where)
            if not _NAME.match(str(function.get("name"))):
                raise _bad(f"{where}.name: Invalid function name.")
            if "parameters" in function:
                _schema(function["parameters"], f"{where}.parameters")
    config = data.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise _bad("generation_config: must be an object")
    _unknown(config, _CONFIG, "generation_config")
    for key, kinds in _NUMBERS.items():
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise _bad(f"Invalid value at 'generation_config.{key}' ({value!r})")
    for key, (low, high) in _RANGES.items():
        value = config.get(key)
        if value is not None and not low <= value <= high:
            raise _bad(f"Invalid value at 'generation_config.{key}' ({value!r}): out of "
                       f"range [{low}, {high}]")
    stops = config.get("stopSequences")
    if stops is not None and not (isinstance(stops, list)
                                  and all(isinstance(x, str) for x in stops)):
        raise _bad("Invalid value at 'generation_config.stop_sequences'")
    if "responseSchema" in config:
        if config.get("responseMimeType") != "application/json":
            raise _bad("generation_config.response_schema: only with response_mime_type "
                       "application/json")
        _schema(config["responseSchema"], "generation_config.response_schema")
    if len(config.get("stopSequences") or ()) > 5:
        raise _bad("generation_config.stop_sequences: at most 5")


def _parts(parts: Any, where: str) -> None:
    if not isinstance(parts, list) or not parts:
        raise _bad(f"{where}.parts: must not be empty")
    for k, part in enumerate(parts):
        data = [key for key in part if key in _PART] if isinstance(part, dict) else []
        if len(data) != 1:
            raise _bad(f"{where}.parts[{k}]: a part holds exactly one data field (got "
                       f"{data or part!r})")
        _unknown(part, _PART | _PART_EXTRA, f"{where}.parts[{k}]")
        call = part.get("functionCall") or part.get("functionResponse")
        if call is not None:
            value = call.get("args", {}) if "functionCall" in part else call.get("response")
            if not _NAME.match(str(call.get("name"))) or not isinstance(value, dict):
                raise _bad(f"{where}.parts[{k}]: a function call needs a name and an object")
        if "text" in part and not isinstance(part["text"], str):
            raise _bad(f"{where}.parts[{k}].text: must be a string")


def _schema(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise _bad(f"{where}: must be an object")
    _unknown(schema, _SCHEMA, where)
    if "type" in schema and str(schema["type"]).upper() not in _TYPES:
        raise _bad(f"{where}.type: invalid value {schema['type']!r}")
    for name, sub in (schema.get("properties") or {}).items():
        _schema(sub, f"{where}.properties[{name}]")
    if "items" in schema:
        _schema(schema["items"], f"{where}.items")
    for i, sub in enumerate(schema.get("anyOf") or ()):
        _schema(sub, f"{where}.any_of[{i}]")


def prompt_words(data: dict[str, Any]) -> list[str]:
    """The prompt as words (the fake's tokens), in the order a prefix cache reads it:
    systemInstruction, tools, then each content's parts, a piece per part."""
    return [w for piece in _pieces(data) for w in piece.split()]


def _pieces(data: dict[str, Any]) -> Iterator[str]:
    for part in (data.get("systemInstruction") or {}).get("parts") or ():
        yield str(part.get("text", ""))
    for tool in data.get("tools") or ():
        yield orjson.dumps(tool).decode()
    for content in data["contents"]:
        for part in content["parts"]:
            text = part.get("text")
            yield f"<{content['role']}> " + (text if isinstance(text, str)
                                            else orjson.dumps(part).decode())


class ImplicitCache:
    """Gemini's implicit caching (module docstring): ``cached(data, scope)`` -> tokens read."""

    def __init__(self, min_tokens: int = 1024) -> None:
        self.min_tokens = min_tokens
        self._seen: set[bytes] = set()

    def cached(self, data: dict[str, Any], model: str, scope: str = "") -> int:
        hasher = hashlib.blake2b(f"{scope}\0{model}".encode(), digest_size=16)
        words, read = 0, 0
        for piece in _pieces(data):  # prefixes end at part boundaries
            hasher.update(piece.encode() + b"\0")
            words += len(piece.split())
            digest = hasher.copy().digest()
            if words >= self.min_tokens:
                if digest in self._seen:
                    read = words
                self._seen.add(digest)
        return read


def answer(data: dict[str, Any], model: str, headers: dict[str, str],
           cached: int = 0) -> dict[str, Any]:
    """The GenerateContentResponse the headers ask for (module docstring)."""
    config = data.get("generationConfig") or {}
    wanted = int(headers.get("x-fake-tokens", 8))
    n = min(wanted, config.get("maxOutputTokens") or wanted)
    prompt = len(prompt_words(data))
    usage: dict[str, Any] = {"promptTokenCount": prompt}
    if cached:
        usage["cachedContentTokenCount"] = cached
    out: dict[str, Any] = {"modelVersion": model, "responseId": uuid.uuid4().hex[:22]}
    if "x-fake-block" in headers:
        return {**out, "promptFeedback": {"blockReason": "SAFETY"},
                "usageMetadata": {**usage, "totalTokenCount": prompt}}
    schema = config.get("responseSchema")
    parts: list[dict[str, Any]]
    if schema is not None:
        parts = [{"text": orjson.dumps(json_instance(_lower(schema))).decode()}]
    else:
        parts = [{"text": " ".join(f"tok{i}" for i in range(n))}] if n else []
    call = _call(data, headers)
    if call is not None:
        parts, n = [{"functionCall": call}], 1
    finish = headers.get("x-fake-finish") or ("MAX_TOKENS" if n < wanted and call is None
                                              else "STOP")
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts},
                                 "finishReason": finish, "index": 0}
    if finish == "SAFETY":
        candidate["safetyRatings"] = [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                                       "probability": "HIGH", "blocked": True}]
    usage.update(candidatesTokenCount=n, totalTokenCount=prompt + n)
    return {**out, "candidates": [candidate], "usageMetadata": usage}


def _call(data: dict[str, Any], headers: dict[str, str]) -> dict[str, Any] | None:
    steer = headers.get("x-fake-tool")
    declared = [f for t in data.get("tools") or () for f in t.get("functionDeclarations") or ()]
    if not steer or not declared:
        return None
    answered = any("functionResponse" in p for c in data["contents"] for p in c["parts"])
    if steer == "once" and answered:
        return None
    return {"name": declared[0]["name"], "args": {"x": 1}}


def _lower(schema: Any) -> Any:
    """A Gemini Schema with JSON Schema's lower-case type names (for json_instance)."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else _lower(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_lower(v) for v in schema]
    return schema


def events(whole: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``whole`` as streamGenerateContent's chunks: a word a chunk (a function call whole),
    each with the prompt's usage, the last with finishReason and the final usage."""
    if "candidates" not in whole:
        yield whole
        return
    candidate = whole["candidates"][0]
    usage = whole["usageMetadata"]
    head = {k: v for k, v in whole.items() if k not in ("candidates", "usageMetadata")}
    pieces: list[dict[str, Any]] = []
    for part in candidate["content"]["parts"]:
        if "text" in part:
            words = part["text"].split(" ")
            pieces += [{"text": w if i == 0 else " " + w} for i, w in enumerate(words)]
        else:
            pieces.append(part)
    partial = {k: v for k, v in usage.items() if k != "candidatesTokenCount"}
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        chunk: dict[str, Any] = {"content": {"role": "model", "parts": [piece]}, "index": 0}
        if last:
            chunk.update((k, v) for k, v in candidate.items() if k != "content")
        yield {"candidates": [chunk], "usageMetadata": usage if last else partial, **head}
    if not pieces:
        yield {"candidates": [{k: v for k, v in candidate.items() if k != "content"}],
               "usageMetadata": usage, **head}
