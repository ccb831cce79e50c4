"""Stage ``prompt_cache``: what each upstream is sent hits the provider's prompt cache more
often, and means the same.

Chat requests only, from any client API (a Responses request's system prompt is its
``instructions``, read in its chat view). The stage reads the request once (which of its
system prompt's lines changed since the same key's recent requests for the same model) and
sets ``ctx.shape_body``: dispatch calls it once per target with the body in the upstream's
format, after any translation, and sends what it returns. What it may change, as the
policy's ``[prompt_cache]`` enables it, and nothing else (README's "What each stage may
change"): tools in a stable order with sorted keys, at most 3 volatile lines of the system
prompt moved verbatim to the very end of the request under one marker line (only on
evidence: seen to change, or a whole metadata line such as "Current date: ..."; never from
inside a document, list, table, code or JSON), Anthropic ``cache_control`` markers placed (at
most 4 with the client's, a rolling one on the conversation's tail), and OpenAI's
``prompt_cache_key`` set (:mod:`gateway.prompt_cache.shape`). With the stage off (not in the pipeline, or
``enabled = false``), ``shape_body`` stays unset and the client's bytes are forwarded as
they came (but for its own ``prompt_cache_key``, namespaced by its gateway key at the door
whatever the stages: :mod:`gateway.prompt_cache.cache_keys`).

A request too short to be cached anywhere (under the policy's smallest minimum cacheable
length, ``min_tokens`` and ``default_min_tokens``, as estimated from its size: 1,024 tokens
by default, OpenAI's minimum and Anthropic's smallest) is left alone: there is nothing to
gain, so it pays nothing.

Once the upstream accepted the request, the prefixes it was asked to cache are remembered
(per gateway key, fingerprints only) for the next request's lookback and TTL. The memory
belongs to the gateway, so a policy reload keeps it.
Sources: https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching,
https://platform.openai.com/docs/guides/prompt-caching.
"""

from __future__ import annotations

from typing import Any

from gateway.context import Next, Reply, RequestContext
from gateway.policy import PromptCachePolicy
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.shape import Settings, Shaping
from gateway.prompt_cache.volatile import Detector

__all__ = ["PromptCacheStage", "build", "settings"]


def build(policy: PromptCachePolicy, memory: PromptMemory, keys: CacheKeys
          ) -> PromptCacheStage | None:
    """None when the policy turns the stage off."""
    if not policy.enabled:
        return None
    return PromptCacheStage(settings(policy), memory, keys)


def settings(policy: PromptCachePolicy) -> Settings:
    """The policy section ready to use (its patterns compiled, once per policy load)."""
    return Settings(
        detector=Detector(policy.patterns) if policy.relocate_volatile else None,
        detect_changes=policy.detect_changes, sort_tools=policy.sort_tools,
        breakpoints=policy.breakpoints, openai_cache_key=policy.openai_cache_key,
        ttl=policy.ttl, min_tokens=policy.min_tokens,
        default_min_tokens=policy.default_min_tokens, lookback_blocks=policy.lookback_blocks)


class PromptCacheStage:
    def __init__(self, settings: Settings, memory: PromptMemory, keys: CacheKeys) -> None:
        self.settings = settings
        self.memory = memory
        self.keys = keys
        # Bytes below which no provider caches the prompt (the stage's estimate is bytes/4
        # tokens, which the JSON around the text only inflates: a conservative cut).
        self.min_bytes = 4 * min([settings.default_min_tokens, *settings.min_tokens.values()])

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.kind != "chat" or len(ctx.raw) < self.min_bytes:
            return await call_next(ctx)
        api = ctx.api.name
        # a Responses request's system prompt is read in its chat view (instructions first)
        shaping = Shaping(self.settings, self.memory, self.keys, ctx.record, ctx.key_id,
                          ctx.model, ctx.chat if api == "responses" else ctx.body,
                          "openai" if api == "responses" else api)
        before = ctx.shape_body
        if before is None:
            ctx.shape_body = shaping
        else:  # another stage shapes too: its output is shaped here
            def both(body: dict[str, Any], api: str) -> dict[str, Any]:
                return shaping(before(body, api), api)
            ctx.shape_body = both
        reply = await call_next(ctx)
        if reply.status == 200:
            shaping.commit()
        return reply
