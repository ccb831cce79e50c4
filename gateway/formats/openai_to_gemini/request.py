"""An OpenAI client calling a Gemini upstream: its Chat Completions request becomes a
``generateContent`` request. Pure, no I/O.

    gemini_request(body, model) -> the GenerateContentRequest (a dict, ``model`` first: the
                                   upstream moves it into the URL)

Inputs are the request dicts as the door checked them; the rest is read here through
:mod:`gateway.formats.checks`' readers (a field of the wrong shape: a 400 naming it). What has
no equivalent raises :class:`~gateway.errors.InvalidRequest` (400, ``unsupported_parameter`` or
``unsupported_value``), a value that changes nothing does not.

Request, OpenAI -> Gemini (any field not listed here raises too)::

    system / developer messages       systemInstruction.parts (text), in order
    user messages                     contents role "user": text parts; image_url, input_audio,
                                      file (file_data) as inlineData from data: URLs / base64;
                                      an image's http(s) or gs:// URL as fileData
    assistant messages                contents role "model": text, tool_calls as functionCall
                                      parts (args: the parsed arguments, an object, else 400)
    tool messages                     functionResponse parts (name: the call's, found by its
                                      id; response: the content when a JSON object, else
                                      {"result": content}), in a "user" content
    consecutive contents of a role    merged (parallel calls' results in one content)
    max_completion_tokens|max_tokens  generationConfig.maxOutputTokens
    temperature, top_p, top_k, seed,
    presence/frequency_penalty        temperature, topP, topK, seed, presence/frequencyPenalty
    stop (string | list)              stopSequences
    response_format json_schema       responseMimeType "application/json" + responseSchema
                                      (:mod:`.schema`); json_object: the mime type alone
    tools (type function)             tools[0].functionDeclarations {name, description,
                                      parameters (:mod:`.schema`)}
    tool_choice                       toolConfig.functionCallingConfig.mode AUTO|ANY|NONE,
                                      a named function: ANY + allowedFunctionNames
    n > 1, logprobs, top_logprobs, logit_bias, audio, modalities with audio, prediction,
    reasoning_effort, web_search_options, verbosity (but "medium"), functions /
    function_call (legacy)            400
    stream, stream_options, parallel_tool_calls, user, safety_identifier, store, metadata,
    service_tier, prompt_cache_key, prompt_cache_retention, prompt_cache_options
                                      dropped (the stream is the URL's; Gemini has no switch
                                      for parallel calls; the rest do not change the answer)

Sources: https://ai.google.dev/api/generate-content, https://ai.google.dev/api/caching#Content,
https://ai.google.dev/gemini-api/docs/function-calling,
https://platform.openai.com/docs/api-reference/chat
"""

from __future__ import annotations

import mimetypes
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.formats.checks import a_string, an_array, an_object, required
from gateway.formats.openai_only import NO_EQUIVALENT, never
from gateway.formats.openai_to_gemini.schema import gemini_schema

__all__ = ["gemini_request"]

_UPSTREAM = "a Gemini upstream"
_DROPPED = frozenset({"model", "stream", "stream_options", "parallel_tool_calls", "user",
                      "safety_identifier", "store", "metadata", "service_tier",
                      "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"})
#: OpenAI name -> generationConfig name, sent as they are.
_SAMPLING = {"temperature": "temperature", "top_p": "topP", "top_k": "topK", "seed": "seed",
             "presence_penalty": "presencePenalty", "frequency_penalty": "frequencyPenalty"}
_MAPPED = frozenset({"messages", "max_tokens", "max_completion_tokens", "stop", "tools",
                     "tool_choice", "response_format", *_SAMPLING})
_AUDIO = {"wav": "audio/wav", "mp3": "audio/mp3"}


def _unsupported(feature: str, param: str, code: str = "unsupported_parameter") -> InvalidRequest:
    return InvalidRequest(f"{feature} is not supported when the model is served by "
                          f"{_UPSTREAM}", param=param, code=code)


def gemini_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The GenerateContentRequest for ``model`` asking what the Chat Completions request
    ``body`` asks. Raises InvalidRequest (400) for what has no equivalent (module
    docstring)."""
    for key, value in body.items():
        if value is None or key in _DROPPED or key in _MAPPED:
            continue
        feature, harmless = NO_EQUIVALENT.get(key, (f"'{key}'", never))
        if not harmless(value):
            code = "unsupported_parameter" if harmless is never else "unsupported_value"
            raise _unsupported(feature, key, code)
    system, contents = _contents(an_array(body.get("messages"), "messages"))
    out: dict[str, Any] = {"model": model}
    tools = [_declaration(t, i) for i, t in enumerate(an_array(body.get("tools"), "tools"))]
    if tools:
        out["tools"] = [{"functionDeclarations": tools}]
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            out["toolConfig"] = {"functionCallingConfig": choice}
    if system:
        out["systemInstruction"] = {"parts": system}
    out["contents"] = contents
    config = _generation_config(body)
    if config:
        out["generationConfig"] = config
    return out


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    tokens = body.get("max_completion_tokens")
    tokens = body.get("max_tokens") if tokens is None else tokens
    if tokens is not None:
        config["maxOutputTokens"] = tokens
    for key, name in _SAMPLING.items():
        if body.get(key) is not None:
            config[name] = body[key]
    stop = body.get("stop")
    stops = [s for s in ([stop] if isinstance(stop, str) else an_array(stop, "stop")) if s]
    if stops:
        config["stopSequences"] = stops
    fmt = an_object(body.get("response_format") or {}, "response_format")
    kind = fmt.get("type")
    if kind == "json_object":
        config["responseMimeType"] = "application/json"
    elif kind == "json_schema":
        spec = an_object(required(fmt, "json_schema", "response_format.json_schema"),
                         "response_format.json_schema")
        config["responseMimeType"] = "application/json"
        config["responseSchema"] = gemini_schema(
            required(spec, "schema", "response_format.json_schema.schema"),
            "response_format.json_schema.schema")
    elif kind not in (None, "text"):
        raise _unsupported(f"response_format {kind!r}", "response_format", "unsupported_value")
    return config


def _contents(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(systemInstruction parts, contents), same-role contents merged."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = an_object(message, where).get("role")
        if role in ("system", "developer"):
            system += [{"text": t} for t in _texts(message.get("content"), where) if t]
            continue
        if role == "user":
            parts, gemini_role = _user_parts(message.get("content"), where), "user"
        elif role == "assistant":
            parts, gemini_role = _model_parts(message, where, names), "model"
        elif role == "tool":
            parts, gemini_role = [_function_response(message, where, names)], "user"
        else:
            raise _unsupported(f"messages with role {role!r}", f"{where}.role",
                               "unsupported_value")
        if not parts:
            continue
        if contents and contents[-1]["role"] == gemini_role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": gemini_role, "parts": parts})
    return system, contents


def _texts(content: Any, where: str) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [a_string(an_object(p, f"{where}.content[{j}]").get("text"),
                     f"{where}.content[{j}].text")
            for j, p in enumerate(an_array(content, f"{where}.content"))]


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(an_array(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        kind = an_object(part, at).get("type")
        if kind == "text":
            text = a_string(part.get("text"), f"{at}.text")
            if text:
                parts.append({"text": text})
        elif kind == "image_url":
            url = a_string(an_object(required(part, "image_url", f"{at}.image_url"),
                                     f"{at}.image_url").get("url"), f"{at}.image_url.url")
            parts.append(_media(url, f"{at}.image_url.url"))
        elif kind == "input_audio":
            audio = an_object(required(part, "input_audio", f"{at}.input_audio"),
                              f"{at}.input_audio")
            audio_type = _AUDIO.get(str(audio.get("format")))
            if audio_type is None:
                raise _unsupported(f"audio format {audio.get('format')!r}",
                                   f"{at}.input_audio.format", "unsupported_value")
            parts.append({"inlineData": {"mimeType": audio_type, "data": a_string(
                audio.get("data"), f"{at}.input_audio.data")}})
        elif kind == "file":
            data = an_object(required(part, "file", f"{at}.file"), f"{at}.file").get("file_data")
            if not isinstance(data, str):
                raise _unsupported("files by 'file_id'", f"{at}.file", "unsupported_value")
            parts.append(_media(data, f"{at}.file.file_data"))
        else:
            raise _unsupported(f"{kind!r} content parts", f"{at}.type", "unsupported_value")
    return parts


def _media(url: str, param: str) -> dict[str, Any]:
    """A data: URL as inlineData; an http(s) or gs:// URL as fileData (its type guessed from
    its name)."""
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        mime, _, encoding = head.partition(";")
        if encoding != "base64" or not mime:
            raise InvalidRequest(f"'{param}' must be a base64 data: URL", param=param,
                                 code="invalid_value")
        return {"inlineData": {"mimeType": mime, "data": data}}
    if url.startswith(("https://", "http://", "gs://")):
        guessed = mimetypes.guess_type(url.partition("?")[0])[0]
        if guessed is None:
            raise _unsupported("a file URL whose type its name does not tell", param,
                               "unsupported_value")
        return {"fileData": {"mimeType": guessed, "fileUri": url}}
    raise InvalidRequest(f"'{param}' must be a data:, http(s) or gs:// URL", param=param,
                         code="invalid_value")


def _model_parts(message: dict[str, Any], where: str,
                 names: dict[str, str]) -> list[dict[str, Any]]:
    content = message.get("content")
    texts = [] if content is None else _texts(content, where)
    if message.get("refusal") and not any(texts):
        texts = [str(message["refusal"])]
    parts: list[dict[str, Any]] = [{"text": t} for t in texts if t]
    for k, call in enumerate(an_array(message.get("tool_calls"), f"{where}.tool_calls")):
        at = f"{where}.tool_calls[{k}]"
        function = an_object(required(an_object(call, at), "function", f"{at}.function"),
                             f"{at}.function")
        name = a_string(function.get("name"), f"{at}.function.name")
        try:
            args = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            raise InvalidRequest(f"'{at}.function.arguments' must be a JSON object for a "
                                 "Gemini upstream", param=f"{at}.function.arguments",
                                 code="invalid_value")
        if isinstance(call.get("id"), str):
            names[call["id"]] = name
        parts.append({"functionCall": {"name": name, "args": args}})
    return parts


def _function_response(message: dict[str, Any], where: str,
                       names: dict[str, str]) -> dict[str, Any]:
    call_id = a_string(message.get("tool_call_id"), f"{where}.tool_call_id")
    name = names.get(call_id)
    if name is None:
        raise InvalidRequest(f"'{where}.tool_call_id' answers no earlier tool call (Gemini "
                             "needs the function's name)", param=f"{where}.tool_call_id",
                             code="invalid_value")
    content = message.get("content")
    text = content if isinstance(content, str) else "".join(_texts(content, where))
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    response = value if isinstance(value, dict) else {"result": text}
    return {"functionResponse": {"name": name, "response": response}}


def _declaration(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    kind = an_object(tool, where).get("type")
    if kind != "function":
        raise _unsupported(f"{kind!r} tools ({where})", f"{where}.type", "unsupported_value")
    function = an_object(required(tool, "function", f"{where}.function"), f"{where}.function")
    out: dict[str, Any] = {"name": a_string(function.get("name"), f"{where}.function.name")}
    if function.get("description"):
        out["description"] = function["description"]
    parameters = function.get("parameters")
    if parameters and (an_object(parameters, f"{where}.function.parameters")
                       .get("properties") or parameters.get("type") != "object"):
        out["parameters"] = gemini_schema(parameters, f"{where}.function.parameters")
    return out


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None or choice == "auto":
        return None if choice is None else {"mode": "AUTO"}
    if choice == "required":
        return {"mode": "ANY"}
    if choice == "none":
        return {"mode": "NONE"}
    function = an_object(an_object(choice, "tool_choice").get("function"),
                         "tool_choice.function")
    return {"mode": "ANY", "allowedFunctionNames": [
        a_string(function.get("name"), "tool_choice.function.name")]}
