"""The stage table: every stage a policy may name, what it is built from, and what must run
before it. Read top to bottom, it is the request path of the default policy::

    rate_limit -> cache -> coalesce -> route -> compress -> prompt_cache -> admission -> dispatch

Each row's factory takes the policy snapshot and the gateway's long-lived
:class:`Services`, and hands its stage module's ``build`` only what that stage needs (its
policy section, the services it uses); ``build`` returns None when the stage has nothing to
do under this policy (no cache configured, no router, compression off), and the stage is
then left out of the chain. ``after`` names the stages that must run before this one when
both are listed.

:func:`check_stages` is the one check of a policy's ``[pipeline] stages`` against this table:
the gateway runs it on every policy it loads (start-up and live reload, through the policy
store's check, so a bad edit is rejected and the old pipeline keeps serving), and
``gateway check`` runs it too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.cache.cache import ResponseCache
from gateway.coalesce.flight import Flights
from gateway.compression.state import CompressionState
from gateway.context import Stage
from gateway.entry_limits import EntryLimits, ModelLimiters
from gateway.metrics import Metrics
from gateway.models import ModelTable
from gateway.policy import Policy
from gateway.prompt_cache.cache_keys import CacheKeys
from gateway.prompt_cache.memory import PromptMemory
from gateway.ratelimit.limiter import RateLimiter
from gateway.routing.decision import Routers
from gateway.stages import admission, cache, coalesce, compress, prompt_cache, rate_limit, route
from gateway.upstreams.base import Upstream

__all__ = ["STAGES", "Services", "StageRow", "check_stages"]


@dataclass(frozen=True, slots=True)
class Services:
    """What stages may be built with besides the policy: the gateway's long-lived objects,
    kept across policy reloads (built once, at start-up, in ``gateway/state.py``)."""

    metrics: Metrics
    models: ModelTable
    upstreams: Mapping[str, Upstream]
    #: None when the config has no ``[cache] enabled = true``.
    cache: ResponseCache | None
    routers: Routers
    #: The compress stage's learned rates and token counters.
    compression: CompressionState
    #: The prompt_cache stage's memory of recent requests.
    prompt_memory: PromptMemory
    #: OpenAI prompt_cache_key values under the deployment's secret.
    cache_keys: CacheKeys
    #: The rate_limit stage's buckets and Redis client.
    rate_limiter: RateLimiter
    #: Admission's gateway-wide and per-key limits, and per-model slots.
    entry_limits: EntryLimits
    model_limiters: ModelLimiters
    #: The coalesce stage's calls in flight.
    flights: Flights
    #: Requests may be traced (gateway.tracing): the pipeline times each stage.
    traced: bool = False


@dataclass(frozen=True, slots=True)
class StageRow:
    """One stage: ``build(policy, services)`` -> the stage, or None to leave it out; ``after``:
    the stages that must come before it when both are in the pipeline."""

    build: Callable[[Policy, Services], Stage | None]
    after: tuple[str, ...] = ()


STAGES: dict[str, StageRow] = {
    "rate_limit": StageRow(lambda p, s: rate_limit.build(p.rate_limits, s.rate_limiter)),
    "cache": StageRow(lambda p, s: cache.build(p.cache, s.cache, s.upstreams)),
    # A hit answers before any call is shared; only the leader of a shared call takes
    # upstream capacity (admission) or is routed.
    "coalesce": StageRow(lambda p, s: coalesce.build(p.coalesce, s.flights),
                         after=("rate_limit", "cache")),
    "route": StageRow(lambda p, s: route.build(p.routing, s.routers, s.models)),
    # The cache keys on the request as the client sent it (so does the router, through
    # ctx.chat); the tokenizer and the prefill rate are the model's the route stage chose.
    "compress": StageRow(
        lambda p, s: compress.build(p.compression, s.compression, s.upstreams),
        after=("cache", "route")),
    "prompt_cache": StageRow(lambda p, s: prompt_cache.build(p.prompt_cache, s.prompt_memory,
                                                             s.cache_keys)),
    # Admission needs the model to serve, which the route stage chooses.
    "admission": StageRow(
        lambda p, s: admission.build(s.entry_limits, s.model_limiters, s.metrics, s.models),
        after=("route",)),
}


def check_stages(names: Sequence[str]) -> None:
    """Check a policy's ``[pipeline] stages`` against the table. Raises ValueError naming the
    key and the problem: an unknown stage, a duplicate, or a stage listed before one that
    must run first (e.g. ``pipeline.stages[0]: 'admission' must come after 'route'``)."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name not in STAGES:
            raise ValueError(f"pipeline.stages[{i}]: unknown stage {name!r}; known stages: "
                             f"{', '.join(sorted(STAGES))}")
        if name in seen:
            raise ValueError(f"pipeline.stages[{i}]: {name!r} is listed twice")
        seen.add(name)
    for i, name in enumerate(names):
        for before in STAGES[name].after:
            if before in names[i + 1:]:
                raise ValueError(f"pipeline.stages[{i}]: {name!r} must come after {before!r}")
