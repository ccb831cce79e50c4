"""The equivalence contract: what an upstream may receive differently from what the client
sent (same API on both sides), everything else identical (parsed JSON, key order aside).

Gateway-wide:

- G1 ``model`` becomes the target's upstream model name (the route stage: one of a tier's,
  when the client asked a router): :attr:`Allowed.models`.
- G2 OpenAI streaming: ``stream_options.include_usage = true`` when the client did not ask.
- G3 OpenAI: a ``prompt_cache_key`` the client set (a string) becomes ``gwk-`` + 32 lowercase
  hex digits, an HMAC of it under the client's gateway key and the deployment's secret (the
  same value from the same key, the same key upstream; another key's never equal: tenants
  share the upstream's prompt cache). Whatever the policy, stages on or off.

Stage prompt_cache (on by default):

- P1 ``tools`` reordered and keys inside them reordered: the same multiset of definitions.
- P2 OpenAI: ``prompt_cache_key`` ("gw-" + 16 lowercase hex digits, an HMAC under the
  deployment's secret of the gateway key, the static prefix and the opening message)
  when the client set none.
- P3 Anthropic: ``cache_control`` markers (``{"type": "ephemeral"}``, optionally with
  ``"ttl": "1h"``) on at most 4 blocks in all, the client's counted and kept; a string
  ``system`` or message ``content`` may become one text block to carry one. Both sides are
  normalised (a string is one text block; markers the client did not set dropped) before
  they are compared.
- P4 volatile lines moved to the end (:mod:`~tests.gateway.equivalence.relocation`).

Stage compress (when :attr:`Allowed.compress`): the current turn's texts (after the last
assistant message; the system prompt never, ``compression.system`` being off) may be
compressed on the terms of :mod:`~tests.gateway.equivalence.compressed`; none at or before
a client's ``cache_control`` marker. Stages cache, rate_limit and admission change nothing.

Bedrock's InvokeModel (:attr:`Allowed.bedrock`; what it received read back as a Messages
body, :mod:`~tests.gateway.equivalence.bedrock_wire`):

- B1 the client's ``metadata`` and ``service_tier`` (the first-party API's own, which
  Bedrock refuses as unknown keys) are not sent, nor a ``stream`` other than ``true`` (the
  path says whether it streams).

Between APIs the request is translated, so nothing is compared for equality; but a
Responses request's tools keep T1 (:mod:`~tests.gateway.equivalence.responses_rules`):

- T1 to a native upstream, every tool as it came; translated, one function per tool the
  client runs itself (function, custom, each tool of a namespace) under unique names, and
  the hosted tools (``web_search``, ``file_search``, ...) left out, named in the answer's
  ``x-gateway-dropped-tools`` (the policy's default ``[translation] hosted_tools =
  "drop"``): :func:`responses_tools`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from tests.gateway.equivalence.anthropic_rules import anthropic
from tests.gateway.equivalence.diff import first_difference, shorten
from tests.gateway.equivalence.openai_rules import openai
from tests.gateway.equivalence.responses_rules import responses_tools
from tests.gateway.equivalence.rules import Allowed, Verdict, canonical

__all__ = ["Allowed", "Verdict", "check", "responses_tools"]


def check(api: str, client: dict[str, Any], upstream: Any, allowed: Allowed) -> Verdict:
    """Whether ``upstream`` (what the upstream received, parsed) is ``client`` (what the
    client sent) within the contract; neither is modified."""
    if not isinstance(upstream, dict):
        return Verdict(f"$: the upstream received {shorten(upstream)}, not a JSON object")
    c, u = _copy(client), _copy(upstream)
    if allowed.bedrock:  # B1
        for key in ("metadata", "service_tier"):
            c.pop(key, None)
        if c.get("stream", True) is not True:
            del c["stream"]
    verdict = Verdict()
    try:
        error = _model(c, u, allowed) or (openai(c, u, allowed, verdict) if api == "openai"
                                          else anthropic(c, u, allowed, verdict))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:  # shapes the steps assume
        error = f"the upstream body does not have the client's shape ({exc!r})"
    if error is None and canonical(c) != canonical(u):
        error = first_difference(c, u)
    verdict.error = error
    return verdict


def _copy(value: Any) -> Any:
    """A deep copy (an orjson round trip: ~50x faster than copy.deepcopy here; json's for
    what orjson cannot write: past 254 levels, or integers past 64 bits)."""
    try:
        return orjson.loads(orjson.dumps(value))
    except orjson.JSONEncodeError:
        return json.loads(json.dumps(value))


def _model(c: dict[str, Any], u: dict[str, Any], allowed: Allowed) -> str | None:
    if u.get("model") not in allowed.models:
        return (f"$.model: the client asked {c.get('model')!r}, the upstream got "
                f"{u.get('model')!r} (allowed: {sorted(allowed.models)})")
    u["model"] = c.get("model")
    return None
