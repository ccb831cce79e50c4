"""What a cached answer may be reused for: the exact key, the semantic scope, eligibility.

Pure functions over a parsed chat completions request.

- **Exact key**: BLAKE2b (128 bits) of the whole canonical request (sorted-key JSON) minus a short,
  explicit list of fields that cannot change the answer (``stream``, ``stream_options``,
  ``user``...). Any other field, including ones the API adds later, is part of the key by
  default, so a new parameter can never be silently ignored (LiteLLM #5049).
- **Scope**: a semantic hit is possible only between requests with the same namespace
  (tenant), model, system prompt, tools, response format, other output-shaping parameters
  and conversation before the last user turn (SHA-256, computed on first use: most lookups
  never need it, the semantic layer being off or the exact layer hitting). Only the last user message is compared by
  meaning (:func:`gateway.formats.chat_text.final_user_text`: the caller passes it in).
- **Eligibility**: the policy bounds temperature; never with n > 1, logprobs, or a forced
  tool call (those answers are not interchangeable).
- **Headers**: the request's ``Cache-Control`` directives, and its namespace (the key's,
  narrowed by ``x-gateway-cache-namespace``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterable
from typing import Any

import orjson

__all__ = ["NEUTRAL_FIELDS", "Bypass", "CacheKey", "cache_directives", "cache_key",
           "ineligible_reason", "namespace_of"]

#: Fields that do not change what the model answers: excluded from both keys.
NEUTRAL_FIELDS = frozenset({
    "stream", "stream_options", "user", "metadata", "store", "service_tier",
    "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
})
#: Compared by meaning rather than bytes: excluded from the scope (the last user message),
#: or checked against the cached answer at hit time (``max_tokens``).
_SEMANTIC_FIELDS = frozenset({"messages", "max_tokens", "max_completion_tokens"})

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _digest(obj: Any) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=_OPTS)).hexdigest()[:32]


class CacheKey:
    """``exact``: the exact-layer key. ``scope``: the semantic partition (None when the request
    can only hit exactly). ``query``: the text compared by meaning. Immutable by convention;
    the scope's digest is made on first use (raising :class:`Bypass` if it cannot be)."""

    __slots__ = ("_scope", "_scope_of", "exact", "namespace", "query")

    def __init__(self, exact: str, scope: str | None, query: str | None,
                 namespace: str) -> None:
        self.exact = exact
        self._scope = scope
        self.query = query
        self.namespace = namespace
        #: What the scope is made of (request fields, messages, model), until it is made.
        self._scope_of: tuple[dict[str, Any], list[Any], str] | None = None

    @property
    def scope(self) -> str | None:
        parts = self._scope_of
        if parts is not None:
            canonical, messages, model = parts
            shaping = {k: v for k, v in canonical.items() if k not in _SEMANTIC_FIELDS}
            # The leading system and developer messages, then the rest in order: a system
            # message later on (Anthropic's mid-conversation ones) stays where it was said.
            lead = next((i for i, m in enumerate(messages[:-1])
                         if m.get("role") not in ("system", "developer")), len(messages) - 1)
            system, history = messages[:lead], messages[lead:-1]
            try:  # the fields after the list, not in it: no level deeper than the request
                digest = hashlib.sha256(orjson.dumps(
                    [self.namespace, model, _digest(system), _digest(history)]))
                digest.update(orjson.dumps(shaping, option=_OPTS))
            except orjson.JSONEncodeError as exc:
                raise Bypass("the request is nested too deeply to be keyed") from exc
            self._scope = digest.hexdigest()[:32]
            self._scope_of = None
        return self._scope

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheKey):
            return NotImplemented
        return (self.exact, self.scope, self.query, self.namespace) == (
            other.exact, other.scope, other.query, other.namespace)

    def __hash__(self) -> int:
        return hash((self.exact, self.scope, self.query, self.namespace))

    def __repr__(self) -> str:
        return (f"CacheKey(exact={self.exact!r}, scope={self.scope!r}, query={self.query!r}, "
                f"namespace={self.namespace!r})")


class Bypass(Exception):
    """The cache is bypassed for this request: it cannot be keyed (nested past what orjson
    writes), or a backend call failed or was too slow."""


def cache_key(data: dict[str, Any], namespace: str, model: str, query: str | None
              ) -> CacheKey:
    """Keys for a chat request already resolved to a public ``model``. ``query``: its text
    compared by meaning (:func:`gateway.formats.chat_text.final_user_text` of its messages),
    or None when it can only hit exactly. The request must not change while the key lives
    (its scope is made from it on first use). Raises :class:`Bypass`."""
    canonical = {k: v for k, v in data.items() if k not in NEUTRAL_FIELDS}
    canonical["model"] = model
    # BLAKE2b rather than SHA-256: the same 128 bits kept, about half the instructions. The
    # namespace (a JSON string: self-delimiting) hashed before the request rather than in a
    # list with it, which would nest the request one level deeper than the door allowed
    # (254): orjson refuses to write past that (a TypeError, found by the fuzz).
    digest = hashlib.blake2b(orjson.dumps(namespace), digest_size=16)
    try:
        digest.update(orjson.dumps(canonical, option=_OPTS))
    except orjson.JSONEncodeError as exc:  # a translated view deeper than the client's body
        raise Bypass("the request is nested too deeply to be keyed") from exc
    exact = digest.hexdigest()
    if query is None or not query.strip():
        return CacheKey(exact, None, None, namespace)
    key = CacheKey(exact, None, query, namespace)
    key._scope_of = (canonical, data.get("messages") or [], model)
    return key


#: Responses fields naming what only the upstream holds: the request alone is not the question.
_HELD_UPSTREAM = ("previous_response_id", "conversation", "prompt")


def ineligible_reason(data: dict[str, Any], max_temperature: float) -> str | None:
    """Why this request must not be served from (or stored in) the cache, or None. Reads
    fields the door may not have checked (a Responses body's ``temperature``): a value of
    the wrong type makes the request ineligible, never an error here."""
    n = data.get("n")
    if n not in (None, 1):
        return "n"
    if data.get("logprobs") or data.get("top_logprobs"):
        return "logprobs"
    choice = data.get("tool_choice")  # a forced call; Anthropic's {"type": "auto"} is not
    if choice == "required" or isinstance(choice, dict) and choice.get("type") not in (
            "auto", "none"):
        return "tool_choice"
    temperature = data.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(
            temperature, (int, float))):
        return "temperature"  # not a number (a Responses body's, unchecked): the upstream's 400
    if (1.0 if temperature is None else temperature) > max_temperature:
        return "temperature"
    for held in _HELD_UPSTREAM:  # Responses: a conversation or prompt only OpenAI holds
        if held in data:
            return held
    return None


def cache_directives(headers: Iterable[tuple[bytes, bytes]],
                     first: Container[bytes] | None = None) -> set[str]:
    """The request's ``Cache-Control`` directives, lower-cased. ``first``: the header names
    present (the request's :attr:`~gateway.context.RequestContext.header_first`), if known:
    the headers are read only when the name is there."""
    out: set[str] = set()
    if first is not None and b"cache-control" not in first:
        return out
    for k, v in headers:
        if k == b"cache-control":
            out.update(d.strip().lower() for d in v.decode("latin-1").split(","))
    return out


def namespace_of(headers: Iterable[tuple[bytes, bytes]], key_id: str | None,
                 first: Container[bytes] | None = None) -> str:
    """The key's namespace (``default`` without keys), narrowed by ``x-gateway-cache-
    namespace``; a client can never reach another key's entries through the header.
    ``first``: as for :func:`cache_directives`."""
    base = key_id or "default"
    if first is not None and b"x-gateway-cache-namespace" not in first:
        return base
    for k, v in headers:
        if k == b"x-gateway-cache-namespace" and 0 < len(v) <= 128:
            return f"{base}/{v.decode('latin-1')}"
    return base
