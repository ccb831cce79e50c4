"""Policy: what the gateway does to each request, reloaded live from TOML.

The policy file holds the knobs operators tune while traffic flows: the pipeline's stages
and their order, and each stage's settings (cache, routing, prompt cache, admission,
degraded mode), retries and streaming. :class:`PolicyStore` watches the file, parses and
validates an edit on a worker thread, and swaps the new :class:`Policy` in on the event
loop, atomically; an invalid edit is rejected and logged, and the old policy keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
import watchfiles

from gateway.balance import BalancePolicy
from gateway.breaker import BreakerPolicy
from gateway.coalesce.policy import CoalescePolicy
from gateway.compression.policy import CompressionPolicy
from gateway.concurrency import AdmissionPolicy
from gateway.errors import ConfigError
from gateway.ratelimit.policy import RateLimitPolicy
from gateway.retry_budget import RetryBudgetPolicy
from gateway.schema import bounded, load_toml, parse
from gateway.stream_watch_policy import StreamWatchPolicy
from gateway.translation_policy import TranslationPolicy

__all__ = ["CachePolicy", "CompressionPolicy", "DegradedPolicy", "OperatingPoint",
           "PipelinePolicy", "Policy", "PolicyStore", "PromptCachePolicy", "RetryPolicy",
           "RouterPolicy", "RoutingPolicy", "StreamingPolicy", "TranslationPolicy", "load_policy"]

log = structlog.get_logger("gateway.policy")


@dataclass(frozen=True)
class RetryPolicy:
    """Retries per target, with exponential backoff and full jitter.

    Source: AWS Architecture Blog, "Exponential Backoff And Jitter" (2015): the delay before
    retry n (n >= 1) is uniform in [0, min(max_delay_ms, base_delay_ms * 2**(n-1))].
    Retries happen only while no byte has reached the client.
    """

    #: Attempts per target, the first included.
    max_attempts: int = bounded(3, ge=1, le=10)
    base_delay_ms: int = bounded(50, ge=0)
    max_delay_ms: int = bounded(2_000, ge=0)
    #: A Retry-After longer than this (ms) is not waited for: the next target is tried instead.
    max_retry_after_ms: int = bounded(5_000, ge=0)
    retry_on_status: tuple[int, ...] = (429, 500, 502, 503, 504, 529)


@dataclass(frozen=True)
class StreamingPolicy:
    #: Ask OpenAI-style upstreams for the final usage chunk (for logs and metrics); it is
    #: forwarded only to clients that asked for it themselves.
    observe_usage: bool = True
    #: A stream with no event yet (a long prefill, a queue) gets its headers and an SSE
    #: comment after this many seconds, then a comment as often (0: never): gateway.endpoint.
    keepalive_s: float = bounded(15.0, ge=0.0)
    # -- issue 48: resumable streams (gateway.resume) --
    #: Every SSE event sent ends with an ``id:`` line and each stream is kept (config
    #: ``[streams]``) so a client that lost its connection can resume it. Off by default:
    #: ids change every streamed byte clients see, and keeping streams costs memory.
    resume: bool = False
    #: With ``resume``: how long (ms) a stream's upstream keeps streaming with no client
    #: reading it, for one to come back; then it is cancelled (0: at once, as without
    #: resume). 10 s covers a proxy restart or a network change (SDKs retry within
    #: 0.5-8 s) at a bounded cost: an abandoned stream runs on at most 10 s (a few hundred
    #: tokens of a hosted model, 10 s of a slot in the local engine's batch).
    resume_grace_ms: int = bounded(10_000, ge=0, le=600_000)


@dataclass(frozen=True)
class DegradedPolicy:
    """What to do with a request that cannot be admitted, in order (see gateway.stages.admission)."""

    actions: tuple[Literal["cache", "compress", "reroute", "reject"], ...] = (
        "cache", "compress", "reroute", "reject")
    #: Public model name to reroute to (a small tier or the local engine); none: skip reroute.
    reroute_model: str | None = None
    #: Smallest Retry-After sent with a shed response (s).
    min_retry_after_s: int = bounded(1, ge=0)
    #: ``cache``: wait at most this long (ms) for a semantic lookup still under way.
    cache_wait_ms: float = bounded(5.0, ge=0)


@dataclass(frozen=True)
class OperatingPoint:
    """When a semantic-cache candidate is served: cosine similarity at least ``similarity``
    and verifier score at least ``verifier`` (see gateway.cache.policy_verifier)."""

    similarity: float = bounded(0.5, ge=0.0, le=1.0)
    verifier: float = bounded(0.95, ge=0.0, le=1.0)


@dataclass(frozen=True)
class CachePolicy:
    """The semantic cache stage (needs ``[cache] enabled = true`` in the gateway config)."""

    enabled: bool = True
    #: Also match by meaning (else exact matches only). Off by default: a cold error bound
    #: serves no semantic hit until it has learnt (none in bench/workload.py's 600 requests),
    #: while every miss pays an embedding (most of the gateway's CPU there); README.
    semantic: bool = False
    ttl_s: int = bounded(3_600, ge=1)
    #: Requests sampled hotter than this are neither served from nor stored in the cache.
    max_temperature: float = bounded(1.0, ge=0.0, le=2.0)
    #: Store answers that call tools (non-streaming responses only).
    cache_tool_calls: bool = False
    #: Bound on each backend call (ms); slower -> bypass.
    lookup_timeout_ms: float = bounded(20.0, ge=1.0)
    #: Wait at most this long (ms) for the semantic layer, then go upstream while it goes on.
    lookup_budget_ms: float = bounded(2.0, ge=0.0)
    #: Nearest neighbours checked per lookup.
    candidates: int = bounded(4, ge=1, le=32)
    #: Semantic lookups under way at once; beyond it a request skips the semantic layer.
    max_pending_embeddings: int = bounded(16, ge=1)
    #: The verifier of candidates past the cosine floor (its scores are the operating points'):
    #: ``mlp`` (v2, gateway.cache.mlp_verifier) or ``cross`` (v3 cross-encoder, not yet
    #: shipped).
    verifier: Literal["cross", "mlp"] = "mlp"
    operating_point: OperatingPoint = field(default_factory=OperatingPoint)
    #: Used by the degraded-mode ``cache`` action: a looser point, else the request is shed.
    relaxed: OperatingPoint = field(default_factory=lambda: OperatingPoint(0.5, 0.8))
    #: Per public model name: its own operating point.
    routes: dict[str, OperatingPoint] = field(default_factory=dict)
    #: Delta: serve a semantic hit only while the chance its answer is wrong is estimated
    #: within this (thresholds learnt online, gateway.cache.bound); 0: the operating point.
    max_error_rate: float = bounded(0.02, ge=0.0, le=0.5)
    #: Hits within the bound sent upstream anyway, their answers compared (a share).
    explore_share: float = bounded(0.05, ge=0.0, le=1.0)

    def point(self, model: str) -> OperatingPoint:
        return self.routes.get(model, self.operating_point)


@dataclass(frozen=True)
class RouterPolicy:
    """One difficulty router: clients ask for it by name as their ``model`` (see
    gateway.routing). It scores each request (the strong tier's expected accuracy gain over
    the weak one, in [-1, 1]) and sends it to ``strong`` when the score reaches the
    threshold, else to ``weak``.

    The threshold comes from exactly one of: ``quality`` (keep at least this fraction of
    strong-only accuracy, calibrated on the router's dev data), ``strong_share`` (send this
    fraction of dev traffic to the strong tier) or ``threshold`` (a raw score); with none
    set, ``quality = 0.95``.
    """

    weak: str = "small"
    strong: str = "large"
    #: A router shipped with the gateway (gateway/routing/artifacts/NAME.npz) or a path.
    artifact: str = "default"
    quality: float | None = bounded(None, ge=0.0, le=1.0)
    strong_share: float | None = bounded(None, ge=0.0, le=1.0)
    threshold: float | None = bounded(None, ge=-1.0, le=1.0)
    #: Explicit model names whose requests this router also routes (opt-in); requests for
    #: any other model name pass through unchanged.
    models: tuple[str, ...] = ()
    #: The chosen tier fails (5xx, 429, unreachable, prompt too long) or sheds: the other.
    fallback: bool = True
    #: A conversation keeps its tier across turns, rising to ``strong`` at most once and
    #: never dropping back (switching models forfeits the provider's prompt cache: README,
    #: "Routing by difficulty"). false: every turn is scored alone.
    sticky: bool = True

    def __post_init__(self) -> None:
        chosen = [k for k in ("quality", "strong_share", "threshold") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ValueError(f"set one of quality, strong_share, threshold (got {', '.join(chosen)})")
        if self.weak == self.strong:
            raise ValueError(f"weak and strong are the same tier '{self.weak}'")


@dataclass(frozen=True)
class RoutingPolicy:
    """Model routing by difficulty: named tiers of public models, and routers over them."""

    enabled: bool = True
    #: Tier name -> public model names, tried in order (the next on failure or shedding).
    tiers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Router name (what clients send as ``model``) -> its settings.
    routers: dict[str, RouterPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, models in self.tiers.items():
            if not models:
                raise ValueError(f"tier '{name}' lists no models")
        claimed: dict[str, str] = {}
        for name, router in self.routers.items():
            for tier in (router.weak, router.strong):
                if tier not in self.tiers:
                    known = ", ".join(sorted(self.tiers)) or "none"
                    raise ValueError(f"router '{name}' names the tier '{tier}', which is not "
                                     f"in routing.tiers (tiers: {known})")
            for model in router.models:
                if model in self.routers:
                    raise ValueError(f"router '{name}' opts in '{model}', which is a router")
                if model in claimed:
                    raise ValueError(f"the model '{model}' is opted into two routers, "
                                     f"'{claimed[model]}' and '{name}'")
                claimed[model] = name

    def router_for(self, model: str) -> tuple[str, RouterPolicy] | None:
        """The router that handles requests for ``model``, or None (pass through)."""
        if not self.enabled:
            return None
        router = self.routers.get(model)
        if router is not None:
            return model, router
        for name, router in self.routers.items():
            if model in router.models:
                return name, router
        return None


#: Minimum cacheable prompt (tokens) by model-name prefix, the longest matching prefix wins;
#: others: ``default_min_tokens``. Source: Anthropic's prompt caching doc (1024 for Sonnet
#: 4 / 4.5 and Opus 4 / 4.1, 4096 for Opus 4.5 / 4.6 and Haiku 4.5, 2048 for Haiku 3 / 3.5;
#: Sonnet 4.6 is documented at 1024 but observed to cache from 2048 only).
MIN_TOKENS = {
    "claude-opus-4-5": 4096, "claude-opus-4-6": 4096, "claude-haiku-4-5": 4096,
    "claude-sonnet-4-6": 2048, "claude-3-5-haiku": 2048, "claude-3-haiku": 2048,
}


@dataclass(frozen=True)
class PromptCachePolicy:
    """The ``prompt_cache`` stage: provider prompt caches hit more often (see
    gateway.prompt_cache). Sources: https://docs.anthropic.com/en/docs/build-with-claude/
    prompt-caching, https://platform.openai.com/docs/guides/prompt-caching."""

    enabled: bool = True
    #: Tools sorted by name, their keys (JSON schemas included) sorted.
    sort_tools: bool = True
    #: Volatile lines of the system prompt moved to the end of the request, verbatim, on
    #: evidence only: a whole metadata line ("Current date: ...", "Request ID: ..."), a line
    #: seen to change (``detect_changes``) or holding a match of ``patterns``; never from
    #: inside a document, list, table, code or JSON; at most 3 lines and 5% of the system
    #: prompt's tokens a request (gateway.prompt_cache.volatile).
    relocate_volatile: bool = True
    #: Also move lines seen to change between recent requests of the same key and model
    #: whose system prompts were otherwise identical.
    detect_changes: bool = True
    #: More regexes (Python syntax): a line holding a match is volatile (kind ``custom``),
    #: under the same rules.
    patterns: tuple[str, ...] = ()
    #: Anthropic upstreams: add cache_control markers (at most 4 in all, the client's kept).
    breakpoints: bool = True
    #: TTL of the markers added: "5m", "1h", or "auto" (1h for a prefix seen again after
    #: 5 to 60 minutes).
    ttl: Literal["5m", "1h", "auto"] = "5m"
    #: Model-name prefix -> minimum cacheable prompt (tokens); no marker on a shorter prefix.
    min_tokens: dict[str, int] = field(default_factory=lambda: dict(MIN_TOKENS))
    default_min_tokens: int = bounded(1024, ge=0)
    #: Anthropic reads a cached prefix at most ~20 blocks before a marker: past this many
    #: blocks since the last cached one, a marker is added on it.
    lookback_blocks: int = bounded(18, ge=1, le=20)
    #: OpenAI-compatible upstreams: set ``prompt_cache_key`` (the key and the static prefix's
    #: hash) unless the client set one.
    openai_cache_key: bool = True

    def __post_init__(self) -> None:
        for i, pattern in enumerate(self.patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"patterns[{i}]: invalid regular expression {pattern!r}: "
                                 f"{exc}") from exc
        for prefix, tokens in self.min_tokens.items():
            if tokens < 0:
                raise ValueError(f"min_tokens.{prefix}: must be >= 0, got {tokens}")


@dataclass(frozen=True)
class PipelinePolicy:
    """The stages every model request goes through, in order; the terminal step (dispatch to
    the upstreams) always comes last. The names are checked against the stage table
    (:func:`gateway.stage_table.check_stages`) by whatever loads the policy to serve it: the
    gateway at start-up and on reload, and ``gateway check``."""

    stages: tuple[str, ...] = ("rate_limit", "cache", "coalesce", "route", "compress",
                               "prompt_cache", "admission")


@dataclass(frozen=True)
class Policy:
    pipeline: PipelinePolicy = field(default_factory=PipelinePolicy)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    retry_budget: RetryBudgetPolicy = field(default_factory=RetryBudgetPolicy)
    streaming: StreamingPolicy = field(default_factory=StreamingPolicy)
    translation: TranslationPolicy = field(default_factory=TranslationPolicy)
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    degraded: DegradedPolicy = field(default_factory=DegradedPolicy)
    cache: CachePolicy = field(default_factory=CachePolicy)
    prompt_cache: PromptCachePolicy = field(default_factory=PromptCachePolicy)
    compression: CompressionPolicy = field(default_factory=CompressionPolicy)
    routing: RoutingPolicy = field(default_factory=RoutingPolicy)
    rate_limits: RateLimitPolicy = field(default_factory=RateLimitPolicy)
    coalesce: CoalescePolicy = field(default_factory=CoalescePolicy)
    balance: BalancePolicy = field(default_factory=BalancePolicy)
    stream_watch: StreamWatchPolicy = field(default_factory=StreamWatchPolicy)  # issue 48
    version: str = "default"


def load_policy(path: str | Path) -> Policy:
    """Load and validate a policy file; raises ConfigError naming the file and key."""
    return parse(Policy, load_toml(path), str(path))


class PolicyStore:
    """Holds the current policy; ``current`` is replaced whole, never changed in place.

    ``watch()`` runs until cancelled, reloading on change: the file is parsed and validated
    on a worker thread, and the new policy is swapped in (and ``on_reload(ok)`` called) on
    the event loop, so whatever reacts to it (limiters, breakers, the pipeline) changes on
    the thread that serves requests.
    """

    def __init__(self, path: str | Path, on_reload: Callable[[bool], None] | None = None,
                 check: Callable[[Policy], None] | None = None):
        self.path = Path(path)
        #: Checks against the rest of the gateway (e.g. that tiers name known models): raises
        #: ValueError, which rejects the policy like a schema error.
        self._check = check
        self.current: Policy = self.load()
        self.reloads = 0
        self.rejected = 0
        #: Bumped after every reload attempt, valid or not.
        self.generation = 0
        self._on_reload = on_reload

    def load(self) -> Policy:
        """Parse and validate the file (any thread, no side effects); raises ConfigError."""
        try:
            if self.path.stat().st_size == 0:
                # Mid-write (truncate, then write): an empty file would silently mean "all
                # defaults". The write that follows triggers the real reload.
                raise ConfigError(str(self.path), "", "empty policy file")
        except OSError as exc:
            raise ConfigError(str(self.path), "", f"cannot read: {exc}") from exc
        policy = load_policy(self.path)
        if self._check is not None:
            try:
                self._check(policy)
            except ValueError as exc:
                raise ConfigError(str(self.path), "", str(exc)) from exc
        return policy

    async def reload_async(self) -> bool:
        """Load on a worker thread, swap in on the event loop; True when valid."""
        policy: Policy | None = None
        try:
            policy = await asyncio.to_thread(self.load)
        except ConfigError as exc:
            self._rejected(exc)
        return self._commit(policy)

    def _rejected(self, exc: ConfigError) -> None:
        self.rejected += 1
        log.error("policy_rejected", path=str(self.path), error=str(exc))

    def _commit(self, policy: Policy | None) -> bool:
        if policy is not None and policy != self.current:
            self.current = policy
            self.reloads += 1
            log.info("policy_reloaded", path=str(self.path), version=policy.version)
        if self._on_reload is not None:
            self._on_reload(policy is not None)
        self.generation += 1
        return policy is not None

    async def watch(self, ready: asyncio.Event | None = None) -> None:
        """Reload whenever the file changes: editors' atomic renames, and a Kubernetes
        ConfigMap volume's updates (the file is a symlink through ``..data`` into a
        timestamped folder that each update replaces), so the folder the path names is
        watched, recursively, and the file's current target is looked up on each change."""
        folder = self.path.absolute().parent
        folders = [folder]
        if not self.path.resolve().is_relative_to(folder.resolve()):
            folders.append(self.path.resolve().parent)  # a symlink to a file elsewhere

        def relevant(_change: watchfiles.Change, changed: str) -> bool:
            path = Path(changed)
            return (path.name == self.path.name or path.name.startswith("..")
                    or path == self.path.resolve())

        with contextlib.suppress(asyncio.CancelledError):
            watcher = watchfiles.awatch(
                *folders,
                watch_filter=relevant, debounce=50, step=20, yield_on_timeout=True,
                rust_timeout=200)
            async for changes in watcher:
                # The first (empty) yield comes once the OS watch is in place.
                if ready is not None and not ready.is_set():
                    ready.set()
                if changes:
                    try:
                        await self.reload_async()
                    except Exception:  # a bug in what reacts to a reload must not end watching
                        log.exception("policy_reload_failed", path=str(self.path))
