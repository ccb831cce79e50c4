"""Degraded mode: what the gateway does with a request it cannot admit.

Gateway-wide and per-key limits are checked on arrival (:class:`EntryLimits`); a request that
passes is dispatched, and when no target of its model can take it (limiter queue full or
timed out, breakers open: :class:`~gateway.admission.Shed`), the policy's actions run in order:

- ``cache``: serve it from the semantic cache at the policy's relaxed operating point
  (``cache.relaxed``); the answer says ``x-gateway-degraded: cache:<reason>``;
- ``reroute``: serve it from ``degraded.reroute_model`` instead (a small tier or the local
  engine); the answer says so in ``x-gateway-degraded: rerouted:<reason>``;
- ``reject``: answer at once with 503 (429 for a key's own limit), ``Retry-After`` and
  ``{"error": {"type": "overloaded_error", "code": "degraded_mode"}}``.

Never a silent timeout: every degraded answer is labelled in its headers and its log line.
(Harder compression joins the actions when the compression stage lands.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.admission import AdmissionPolicy, Shed
from gateway.errors import Overloaded, TenantLimited
from gateway.policy import DegradedPolicy
from gateway.requestlog import RequestRecord

__all__ = ["EntryLimits", "serve_or_degrade"]

Serve = Callable[[Any], Awaitable[None]]


class EntryLimits:
    """Requests in flight per gateway key, against ``per_key_max_concurrency``, and the
    gateway-wide ``global_max_concurrency``."""

    def __init__(self) -> None:
        self.per_key: dict[str, int] = {}

    def enter(self, policy: AdmissionPolicy, key_id: str | None, in_flight: int,
              retry_after_s: int) -> None:
        """Count the request in; raises TenantLimited (429) or Overloaded (503)."""
        if not policy.enabled:
            return
        if policy.global_max_concurrency and in_flight > policy.global_max_concurrency:
            raise Overloaded("the gateway is at its concurrency limit; retry later",
                             reason="global_limit", retry_after_s=retry_after_s)
        if key_id is not None:
            count = self.per_key.get(key_id, 0)
            if policy.per_key_max_concurrency and count >= policy.per_key_max_concurrency:
                raise TenantLimited(f"key '{key_id}' has {count} requests in flight, its "
                                    "limit; retry later", reason="tenant_limit",
                                    retry_after_s=retry_after_s)
            self.per_key[key_id] = count + 1

    def leave(self, key_id: str | None) -> None:
        if key_id is not None and key_id in self.per_key:
            count = self.per_key[key_id] - 1
            if count:
                self.per_key[key_id] = count
            else:
                del self.per_key[key_id]


async def serve_or_degrade(
    serve: Serve,
    model: Any,
    reroute: Any | None,
    policy: DegradedPolicy,
    rec: RequestRecord,
    extra: list[tuple[bytes, bytes]],
    from_cache: Callable[[str], Awaitable[bool]] | None = None,
) -> None:
    """``serve(model)``; when shed, run the degraded actions. ``reroute`` is the reroute
    model (None when there is none, or it is the model asked for); ``from_cache(label)``
    serves a relaxed semantic-cache hit, labelled, and says whether it could.
    Raises Overloaded when every action is exhausted."""
    try:
        await serve(model)
        return
    except Shed as exc:
        shed = exc
    for action in policy.actions:
        if action == "reject":
            break
        if action == "cache" and from_cache is not None:
            label = f"cache:{shed.reason}"
            if await from_cache(label):
                rec.shed = label
                return
        if action == "reroute" and reroute is not None:
            label = f"rerouted:{shed.reason}"
            rec.shed = label
            extra.append((b"x-gateway-degraded", label.encode()))
            try:
                await serve(reroute)
                return
            except Shed as exc:
                shed = exc
                extra.pop()
    rec.shed = shed.reason
    raise Overloaded(f"the gateway is overloaded ({shed.reason}); retry later",
                     reason=shed.reason,
                     retry_after_s=max(policy.min_retry_after_s, shed.retry_after_s))
