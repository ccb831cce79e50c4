"""Amazon Bedrock's Converse wire format, what the translations to it share. Pure, no I/O.

A request: ``messages`` (``role`` user or assistant, ``content`` a list of blocks, each an
object with one key: ``text``, ``image``, ``document``, ``toolUse``, ``toolResult``,
``reasoningContent``, ``cachePoint``), ``system`` (``text`` and ``cachePoint`` blocks),
``inferenceConfig`` (``maxTokens``, ``temperature``, ``topP``, ``stopSequences``),
``toolConfig`` (``tools``: ``toolSpec`` with ``inputSchema.json``, and ``cachePoint``;
``toolChoice``: ``auto``, ``any`` or ``tool``), ``additionalModelRequestFields`` (what
only the model knows: Claude's ``top_k``, ``thinking``). The model is in the URL; the
translations leave it in the body's ``model`` for the upstream to move
(gateway.upstreams.bedrock).

An answer: ``output.message``, ``stopReason``, ``usage`` (``inputTokens`` without the
cache's, ``outputTokens``, ``totalTokens``, ``cacheReadInputTokens``,
``cacheWriteInputTokens``), ``metrics``. :func:`message_from_converse` reads one as an
Anthropic ``message``, which the other translations take from there.

A structured output (a JSON schema the answer must follow) is asked, as Bedrock's
tool-use guide does, by offering one tool, :data:`JSON_TOOL`, whose input schema is the
schema, and forcing it: its input is the answer, given back as text.
Sources: https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html,
https://docs.aws.amazon.com/bedrock/latest/userguide/conversation-inference-call.html,
https://docs.aws.amazon.com/bedrock/latest/userguide/prompt-caching.html,
https://docs.aws.amazon.com/bedrock/latest/userguide/tool-use-inference-call.html
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamError
from gateway.formats.ids import random_hex

__all__ = ["CACHE_POINT", "JSON_TOOL", "STOP_REASONS", "message_from_converse",
           "usage_from_converse"]

#: The block that marks the end of a cached prefix (as Anthropic's ``cache_control`` on
#: the block before it).
CACHE_POINT: dict[str, Any] = {"cachePoint": {"type": "default"}}
#: The tool a structured output is asked through.
JSON_TOOL = "json_answer"
#: Converse's ``stopReason`` -> Anthropic's ``stop_reason``.
STOP_REASONS = {"end_turn": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens",
                "stop_sequence": "stop_sequence", "guardrail_intervened": "refusal",
                "content_filtered": "refusal", "model_context_window_exceeded": "max_tokens"}


def usage_from_converse(usage: Any) -> dict[str, Any]:
    """Converse usage as Anthropic's (``input_tokens`` excludes the cache's, in both)."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    out = {"input_tokens": usage.get("inputTokens") or 0,
           "output_tokens": usage.get("outputTokens") or 0}
    if usage.get("cacheReadInputTokens") is not None:
        out["cache_read_input_tokens"] = usage["cacheReadInputTokens"]
    if usage.get("cacheWriteInputTokens") is not None:
        out["cache_creation_input_tokens"] = usage["cacheWriteInputTokens"]
    return out


def _block(block: Any) -> dict[str, Any] | None:
    if not isinstance(block, dict):
        return None
    if isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    use = block.get("toolUse")
    if isinstance(use, dict):
        if use.get("name") == JSON_TOOL:
            return {"type": "text", "text": orjson.dumps(use.get("input")).decode()}
        return {"type": "tool_use", "id": use.get("toolUseId") or f"toolu_{random_hex()}",
                "name": use.get("name", ""), "input": use.get("input") or {}}
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, dict):
        text = reasoning.get("reasoningText")
        if isinstance(text, dict):
            return {"type": "thinking", "thinking": text.get("text", ""),
                    "signature": text.get("signature", "")}
        if isinstance(reasoning.get("redactedContent"), str):
            return {"type": "redacted_thinking", "data": reasoning["redactedContent"]}
    return None  # (images and documents never come back)


def message_from_converse(body: Any, model: str = "") -> dict[str, Any]:
    """A 200 Converse answer as an Anthropic ``message``; raises UpstreamError (502) for a
    body that is not one."""
    try:
        content = body["output"]["message"]["content"]
        stop = body["stopReason"]
    except (KeyError, TypeError) as exc:
        raise UpstreamError("Bedrock's Converse answer has no output message") from exc
    blocks = [b for b in map(_block, content if isinstance(content, list) else ()) if b]
    forced = any(isinstance(b, dict) and isinstance(b.get("toolUse"), dict)
                 and b["toolUse"].get("name") == JSON_TOOL for b in content or ())
    reason = "end_turn" if forced else STOP_REASONS.get(stop, "end_turn")
    return {"id": f"msg_bdrk_{random_hex()}", "type": "message", "role": "assistant",
            "model": model, "content": blocks, "stop_reason": reason, "stop_sequence": None,
            "usage": usage_from_converse(body.get("usage"))}
