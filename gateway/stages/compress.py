"""Stage ``compress``: long context in the current turn cut to a token budget, question-aware,
only when it pays.

Chat requests from either API, when the policy's ``[compression]`` enables it. What is
compressed (:mod:`gateway.compression.messages`): documents, passages and long tool results
of the current turn; never the question or instruction, never content at or before a
``cache_control`` marker nor the earlier turns a prompt cache reads; protected spans
(numbers, identifiers, URLs, code, JSON keys and values) byte for byte. How
(:func:`gateway.compression.compress`): units ranked against the question with MiniLM and
BM25, the best kept within ``tokens / target_ratio`` tokens (counted in the target
upstream's tokenizer), the most relevant at both ends.

With ``token_level`` the fine pass (:mod:`gateway.compression.fine`) thins the kept prose
units word by word to the same budget, scored by a local engine (the route's first target
when it is one, else the first ``type = "local"`` upstream; :mod:`gateway.compression.scoring`).
Without a ready engine it is not applied (``compress_fine: "no_engine"``) and the coarse pass
runs alone; a failed scoring call falls back to the coarse result (``"error"``); the
degraded-mode action never runs it (``"degraded"``: the engine is busy enough). The gate
weighs it at its own learned rate (prior ``token_level_ms_per_1k_tokens``) and, when that
does not pay but the coarse pass alone does, compresses coarse alone (``"not_worth_it"``).

When (:mod:`gateway.compression.gate`): the compressible context has at least
``min_tokens`` and, under ``gate = "net_positive"``, the predicted prefill time saved beats
the compressor's own predicted time. The target model's prefill rate is the policy's
``prefill_ms_per_token`` or learned here from its streamed answers (TTFT against the prompt
tokens not read from the provider's prompt cache). A client overrides per request with ``x-gateway-compress: off`` or ``:
<ratio>`` (an explicit ratio compresses whatever the gate and ``min_tokens`` say); any other
value is a 400. A compressed answer carries ``x-gateway-compression: <achieved ratio>``; the
log line has ``compression``, ``tokens_before``, ``tokens_after``, ``compress_ms`` and, when
skipped, ``compress_skip`` (``client_off``, ``nothing_to_compress``, ``short``,
``no_prefill_rate``, ``not_worth_it``, ``no_gain``, ``error``).

Degraded mode: before a request is shed, the ``compress`` action compresses it at
``degraded_ratio`` and tries again (:mod:`gateway.stages.admission`).
Sources: LongLLMLingua (Jiang et al., ACL 2024); Lost in the Middle (Liu et al., TACL 2024).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from gateway import jsonio
from gateway.compression import compress
from gateway.compression.fine import Score
from gateway.compression.gate import CompressorRate, decide
from gateway.compression.messages import plan, rewritten
from gateway.compression.policy import CompressionPolicy
from gateway.compression.scoring import engine_scorer
from gateway.compression.state import CompressionState
from gateway.compression.tokens import CountTokens, estimate
from gateway.context import Next, Outcome, Reply, RequestContext
from gateway.errors import InvalidRequest
from gateway.models import ModelRoute, model_key

if TYPE_CHECKING:
    from gateway.upstreams.base import Upstream

__all__ = ["HEADER", "CompressStage", "build", "requested_ratio"]

HEADER = b"x-gateway-compress"

log = structlog.get_logger("gateway.compression")


def build(policy: CompressionPolicy, state: CompressionState,
          upstreams: Mapping[str, Upstream]) -> CompressStage | None:
    """None when the policy turns compression off."""
    if not policy.enabled:
        return None
    state.warm()
    return CompressStage(state, upstreams)


def requested_ratio(headers: list[tuple[bytes, bytes]]) -> tuple[bool, float | None]:
    """What the client asked in ``x-gateway-compress``: (asked, ratio); ratio None means
    off. Raises InvalidRequest for anything but ``off`` or a number >= 1."""
    for name, value in headers:
        if name != HEADER:
            continue
        text = value.decode("latin-1").strip().lower()
        if text == "off":
            return True, None
        try:
            ratio = float(text)
        except ValueError:
            ratio = float("nan")
        if not 1.0 <= ratio <= 100.0:  # NaN fails too
            raise InvalidRequest(f"x-gateway-compress: expected 'off' or a compression "
                                 f"ratio from 1 to 100 (e.g. 4), got {text[:40]!r}",
                                 param="x-gateway-compress")
        return True, (None if ratio == 1.0 else ratio)
    return False, None


class CompressStage:
    def __init__(self, state: CompressionState, upstreams: Mapping[str, Upstream]) -> None:
        self.state = state
        self.upstreams = upstreams

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.kind != "chat":
            return await call_next(ctx)
        policy = ctx.policy.compression
        asked, ratio = requested_ratio(ctx.headers)
        body, raw = ctx.body, ctx.raw
        route = ctx.route
        first = route.targets[0] if route is not None and route.targets else None
        model = model_key(ctx.target, route, policy.prefill_ms_per_token)  # bounded state
        # This request's last compression: its achieved ratio and the compressor's time (ms).
        achieved: float | None = None
        took: float | None = None
        if asked and ratio is None:
            ctx.record.compress_skip = "client_off"
        else:
            achieved, took = await self._compress(ctx, policy, ratio or policy.target_ratio,
                                                  asked)

        async def harder(label: str) -> bool:
            """The degraded ``compress`` action: the client's request again, cut at
            ``degraded_ratio``; True when it came out smaller than what was tried."""
            nonlocal achieved, took
            if (asked and ratio is None) or policy.degraded_ratio <= (achieved or 1.0):
                return False
            tried = ctx.raw
            ctx.body, ctx.raw = body, raw
            achieved, ms = await self._compress(ctx, policy, policy.degraded_ratio, True,
                                                degraded=True)
            took = ms if ms is not None else took
            if len(ctx.raw) >= len(tried):
                return False
            ctx.response_headers.append((b"x-gateway-degraded", label.encode()))
            return True

        ctx.degraded_compress = harder
        try:
            reply = await call_next(ctx)
        finally:  # another target (the route stage's fallback) starts from the original
            ctx.body, ctx.raw = body, raw
        if first is not None and ctx.stream:
            prefill = self.state.prefill(model)

            def learn(outcome: Outcome) -> None:
                # the prompt's uncached tokens: what a prefill costs (compression cuts only
                # the newest turn, never a cached prefix); a provider's cache reads, nearly
                # free, would flatten the slope wherever cached agent turns share the model
                usage = ctx.usage
                prompt = None if usage is None or usage.prompt_tokens is None \
                    else usage.prompt_tokens - (usage.cached_tokens or 0)
                if (outcome.delivered and ctx.upstream == first.upstream and ctx.ttft_ms
                        and prompt):
                    prefill.observe(prompt, ctx.ttft_ms - ctx.queue_ms - (took or 0.0))
            reply.on_close(learn)
        return reply

    async def _compress(self, ctx: RequestContext, policy: CompressionPolicy, ratio: float,
                        forced: bool, degraded: bool = False
                        ) -> tuple[float | None, float | None]:
        """Compress ``ctx``'s body when it pays (a new body and raw bytes; the client's are
        left as they are); the record says what happened. Returns the achieved ratio (None:
        not compressed) and the compressor's time in ms (None: it did not run)."""
        rec = ctx.record
        rec.compress_skip = rec.compression = rec.compress_fine = None
        if not forced and len(ctx.raw) < policy.min_tokens * 4:  # bytes: cannot be long
            rec.compress_skip = "short"
            return None, None
        t0 = time.perf_counter()
        found = plan(ctx.api.name, ctx.body, policy.system)  # planned once
        size = sum(estimate(s.text) for s in found.segments)
        if not found.segments:
            rec.compress_skip = "nothing_to_compress"
            return None, None
        if not forced and size < policy.min_tokens:
            rec.compress_skip = "short"
            return None, None
        score = None
        if policy.token_level:
            score, rec.compress_fine = (None, "degraded") if degraded else self._scorer(ctx)
        compressor = self._rate(policy, score is not None)
        if not forced and policy.gate == "net_positive":
            model = model_key(ctx.target, ctx.route, policy.prefill_ms_per_token)
            rate = policy.prefill_ms_per_token.get(model)
            if rate is None:
                rate = self.state.prefill(model).ms_per_token
            decision = decide(size, ratio, rate, compressor.ms_per_1k,
                              margin_ms=policy.margin_ms, cost_weight=policy.cost_weight)
            if not decision.compress and score is not None:  # does coarse alone pay?
                compressor = self._rate(policy, False)
                decision = decide(size, ratio, rate, compressor.ms_per_1k,
                                  margin_ms=policy.margin_ms, cost_weight=policy.cost_weight)
                score = None
                rec.compress_fine = "not_worth_it" if decision.compress else None
            if not decision.compress:
                rec.compress_skip = decision.skip
                return None, None
        count = self._counter(ctx.route)
        before = after = 0
        fine: list[str] = []
        texts = []
        try:
            for segment in found.segments:
                result = await compress(segment.text, found.question, ratio, self.state.embed,
                                        count, policy.reorder, pinned=segment.pinned,
                                        score=score)
                before += result.tokens_before
                after += result.tokens_after
                texts.append((segment, result.text))
                fine += [result.fine] if result.fine else []
        except Exception as exc:  # noqa: BLE001 - a compressor bug must not fail the request
            log.warning("compression_failed", request_id=ctx.request_id,
                        error=type(exc).__name__)
            rec.compress_skip = "error"
            return None, None
        ms = (time.perf_counter() - t0) * 1000
        if fine:  # "applied" wins over the segments' other outcomes
            rec.compress_fine = "applied" if "applied" in fine else fine[0]
        scored = any(f in ("applied", "error") for f in fine)
        # a run that never called the scorer teaches the coarse rate, not the fine one
        (compressor if scored else self._rate(policy, False)).observe(size, ms)
        rec.tokens_before, rec.tokens_after = before, after
        took = rec.compress_ms = round(ms, 3)
        if after >= before:
            rec.compress_skip = "no_gain"
            return None, took
        achieved = rec.compression = round(before / max(after, 1), 3)
        body = rewritten(ctx.body, texts)  # the client's body stays as it came
        ctx.body, ctx.raw = body, jsonio.dumps(body)
        ctx.lossy = True  # not the answer to the client's whole context: never cached as such
        ctx.response_headers[:] = [h for h in ctx.response_headers
                                   if h[0] != b"x-gateway-compression"]
        ctx.response_headers.append((b"x-gateway-compression", f"{achieved:.2f}".encode()))
        return achieved, took

    def _rate(self, policy: CompressionPolicy, fine: bool) -> CompressorRate:
        prior = (policy.token_level_ms_per_1k_tokens if fine
                 else policy.compressor_ms_per_1k_tokens)
        return self.state.compressor(prior, fine)

    def _scorer(self, ctx: RequestContext) -> tuple[Score | None, str | None]:
        """The fine pass's scoring call on a ready local engine: the route's first target
        when it is one, else the first configured; (None, "no_engine") without one."""
        route = ctx.route
        first = [route.targets[0].upstream] if route is not None and route.targets else []
        for name in [*first, *self.upstreams]:
            upstream = self.upstreams.get(name)
            engine = getattr(upstream, "engine", None)
            if upstream is not None and engine is not None and upstream.ready:
                return engine_scorer(upstream, engine.model), None
        return None, "no_engine"

    def _counter(self, route: ModelRoute | None) -> CountTokens:
        """Tokens in the tokenizer of the route's first target's upstream."""
        if route is None or not route.targets:
            return estimate
        name = route.targets[0].upstream
        upstream = self.upstreams.get(name)
        if upstream is None:
            return estimate
        engine = getattr(upstream, "engine", None)
        return self.state.counter(name, upstream.api,
                                  getattr(engine, "model", None) if engine else None)
