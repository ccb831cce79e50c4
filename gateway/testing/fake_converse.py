"""The fake Bedrock's Converse and ConverseStream (gateway.testing.fake_bedrock): the body
checked as Bedrock checks it (its top-level keys, each content block one known key, roles,
at most 4 ``cachePoint`` blocks and only on a model Bedrock caches for, a ``toolUse`` only
with a ``toolConfig``), then answered as the Anthropic fake answers the same conversation
(read as Messages: a ``cachePoint`` is the ``cache_control`` of the block before it, so the
simulated prompt cache applies), in Converse's shapes: ``output.message``, ``stopReason``,
``usage`` with ``cacheReadInputTokens``/``cacheWriteInputTokens``; streamed as
``messageStart``, ``contentBlockStart`` (tool uses), ``contentBlockDelta``,
``contentBlockStop``, ``messageStop``, ``metadata`` event-stream frames. A forced tool
(``toolChoice.tool``) is called with an instance of its input schema (a structured output).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from gateway.prompt_cache.converse import MAX_POINTS, caches
from gateway.testing.aws_wire import AwsError, send_body, send_json, start_stream
from gateway.testing.cache_sim import CacheSims
from gateway.testing.eventstream import event_frame, exception_frame
from gateway.testing.fake_anthropic import _answer
from gateway.testing.fake_responses import json_instance
from gateway.testing.fake_upstream import Record
from gateway.types import Send

__all__ = ["ValueRefused", "as_messages", "serve"]

_KEYS = {"messages", "system", "inferenceConfig", "toolConfig", "additionalModelRequestFields",
         "guardrailConfig", "promptVariables", "requestMetadata", "performanceConfig",
         "additionalModelResponseFieldPaths"}
_BLOCKS = {"text", "image", "document", "toolUse", "toolResult", "reasoningContent",
           "cachePoint", "video", "guardContent"}
_INFERENCE = {"maxTokens", "temperature", "topP", "stopSequences"}
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


class ValueRefused(AwsError):
    """A value Bedrock refuses inside a well-shaped request (a tool's name, a text that is
    no string): what a client's own bad value becomes, as opposed to a wrong shape."""


def _invalid(message: str) -> AwsError:
    return AwsError(400, "ValidationException", message)


def _refused(message: str) -> ValueRefused:
    return ValueRefused(400, "ValidationException", message)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _refused(f"{where}: expected a string")
    return value


def _mark(blocks: list[dict[str, Any]], where: str) -> None:
    if not blocks:
        raise _invalid(f"{where}: a cachePoint must follow a block")
    blocks[-1]["cache_control"] = {"type": "ephemeral"}


def _block(block: dict[str, Any]) -> dict[str, Any]:
    if "text" in block:
        return {"type": "text", "text": _text(block["text"], "text")}
    if "toolUse" in block:
        use = block["toolUse"]
        return {"type": "tool_use", "id": use["toolUseId"], "name": use["name"],
                "input": use.get("input", {})}
    if "toolResult" in block:
        result = block["toolResult"]
        texts = [_text(c.get("text", ""), "toolResult.content.text")
                 for c in result.get("content", []) if isinstance(c, dict)]
        return {"type": "tool_result", "tool_use_id": result["toolUseId"],
                "content": " ".join(texts)}
    if "reasoningContent" in block:
        text = block["reasoningContent"].get("reasoningText") or {}
        return {"type": "thinking", "thinking": text.get("text", ""),
                "signature": text.get("signature", "")}
    return {"type": "text", "text": ""}  # images and documents: no words counted


def _blocks(blocks: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(blocks, list):
        raise _invalid(f"{where}: expected a list")
    out: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or len(block) != 1 or next(iter(block)) not in _BLOCKS:
            raise _invalid(f"{where}.{i}: a content block holds exactly one known member")
        if "cachePoint" in block:
            _mark(out, f"{where}.{i}")
        else:
            out.append(_block(block))
    return out


def as_messages(model: str, data: dict[str, Any]) -> dict[str, Any]:
    """A Converse body, checked, read as an Anthropic Messages body (AwsError 400)."""
    unknown = set(data) - _KEYS
    if unknown:
        raise _invalid(f"Malformed input request: extraneous key [{min(unknown)}] is "
                       "not permitted")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages: at least one message is required")
    inference = data.get("inferenceConfig") or {}
    if set(inference) - _INFERENCE:
        raise _invalid(f"inferenceConfig: unknown key {min(set(inference) - _INFERENCE)}")
    body: dict[str, Any] = {"model": model, "max_tokens": inference.get("maxTokens", 4096),
                            "messages": []}
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _invalid(f"messages.{i}.role: must be user or assistant")
        body["messages"].append({"role": message["role"], "content": _blocks(
            message.get("content"), f"messages.{i}.content")})
    if data.get("system") is not None:
        body["system"] = _blocks(data["system"], "system")
    config = data.get("toolConfig")
    if config is not None:
        tools: list[dict[str, Any]] = []
        for i, tool in enumerate(config.get("tools") or ()):
            if "cachePoint" in tool:
                _mark(tools, f"toolConfig.tools.{i}")
                continue
            spec = tool["toolSpec"]
            if not isinstance(spec.get("name"), str) or not _TOOL_NAME.fullmatch(spec["name"]):
                raise _refused(f"toolConfig.tools.{i}.toolSpec.name: must match "
                               "[a-zA-Z0-9_-]{1,64}")
            tools.append({"name": spec["name"], "description": spec.get("description", ""),
                          "input_schema": spec["inputSchema"]["json"]})
        body["tools"] = tools
    elif any(b.get("type") == "tool_use" for m in body["messages"] for b in m["content"]):
        raise _invalid("The toolConfig field must be defined when using toolUse and "
                       "toolResult content blocks.")
    points = orjson.dumps(data).count(b'"cachePoint"')
    if points and not caches(model):
        raise _invalid(f"This model ({model}) doesn't support prompt caching")
    if points > MAX_POINTS:
        raise _invalid(f"A maximum of {MAX_POINTS} cachePoint blocks may be provided")
    return body


def _converse_block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "tool_use":
        return {"toolUse": {"toolUseId": block["id"], "name": block["name"],
                            "input": block["input"]}}
    if block["type"] == "thinking":
        return {"reasoningContent": {"reasoningText": {"text": block["thinking"],
                                                       "signature": block["signature"]}}}
    return {"text": block["text"]}


def _answer_of(sims: CacheSims | None, model: str, data: dict[str, Any],
               headers: dict[str, str]) -> dict[str, Any]:
    body = as_messages(model, data)
    cache = sims.anthropic(body, headers) if sims is not None else None
    message = _answer(body, headers, cache or None)
    content = [_converse_block(b) for b in message["content"]]
    stop = message["stop_reason"]
    forced = ((data.get("toolConfig") or {}).get("toolChoice") or {}).get("tool")
    if forced:  # a forced tool: called with an instance of its schema
        tool = next((t for t in body["tools"] if t["name"] == forced.get("name")), None)
        if tool is None:
            raise _refused("toolConfig.toolChoice.tool.name: not one of the tools")
        content = [{"toolUse": {"toolUseId": "tooluse_fake1", "name": tool["name"],
                                "input": json_instance(tool["input_schema"])}}]
        stop = "tool_use"
    usage = message["usage"]
    out = {"inputTokens": usage["input_tokens"], "outputTokens": usage["output_tokens"],
           "cacheReadInputTokens": usage.get("cache_read_input_tokens", 0),
           "cacheWriteInputTokens": usage.get("cache_creation_input_tokens", 0)}
    out["totalTokens"] = sum(out.values())
    return {"output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop, "usage": out, "metrics": {"latencyMs": 1}}


def _events(answer: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "messageStart", {"role": "assistant"}
    for i, block in enumerate(answer["output"]["message"]["content"]):
        if "toolUse" in block:
            use = block["toolUse"]
            yield "contentBlockStart", {"contentBlockIndex": i, "start": {"toolUse": {
                "toolUseId": use["toolUseId"], "name": use["name"]}}}
            text = orjson.dumps(use["input"]).decode()
            for j in range(0, len(text), 4):
                yield "contentBlockDelta", {"contentBlockIndex": i,
                                            "delta": {"toolUse": {"input": text[j:j + 4]}}}
        elif "reasoningContent" in block:
            reasoning = block["reasoningContent"]["reasoningText"]
            yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {
                "reasoningContent": {"text": reasoning["text"]}}}
            yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {
                "reasoningContent": {"signature": reasoning["signature"]}}}
        else:
            for j, word in enumerate(block["text"].split(" ")):
                yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {
                    "text": word if j == 0 else " " + word}}
        yield "contentBlockStop", {"contentBlockIndex": i}
    yield "messageStop", {"stopReason": answer["stopReason"]}
    yield "metadata", {"usage": answer["usage"], "metrics": answer["metrics"]}


async def serve(model: str, stream: bool, data: dict[str, Any], headers: dict[str, str],
                rec: Record, send: Send, sims: CacheSims | None,
                touch: Callable[[], None]) -> None:
    """Answer a Converse (``stream``: ConverseStream) request for ``model`` (``sims``: the
    simulated prompt caches, None when not simulated; ``touch``: wakes the fake's waiters
    on each text delta sent)."""
    answer = _answer_of(sims, model, data, headers)
    if not stream:
        return await send_json(send, rec, 200, answer)
    await start_stream(send, rec)
    if name := headers.get("x-fake-stream-exception"):
        return await send_body(send, exception_frame(name, "Too many requests, please wait "
                                                           "before trying again."), False)
    midway = int(headers.get("x-fake-error-midway", -1))
    for kind, payload in _events(answer):
        text = kind == "contentBlockDelta" and "text" in payload["delta"]
        if text and rec.chunks_sent == midway:
            return await send_body(send, exception_frame(
                "modelStreamErrorException", "The model stream failed"), False)
        await send_body(send, event_frame(kind, payload), kind != "metadata")
        if text:
            rec.chunks_sent += 1
            touch()
