"""Limits on top of the upstreams' admission (:mod:`gateway.concurrency`):
:class:`EntryLimits`, requests in flight per gateway key and gateway-wide, checked on arrival;
:class:`ModelLimiters`, a public model's own ``model_max_concurrency``, queued as an
upstream's slots are. All state lives on the event-loop thread."""

from __future__ import annotations

import dataclasses

from gateway.concurrency import AdmissionPolicy, Limiter
from gateway.errors import Overloaded, TenantLimited

__all__ = ["EntryLimits", "ModelLimiters"]


class EntryLimits:
    """Requests in flight per gateway key, against ``per_key_max_concurrency``, and the
    gateway-wide ``global_max_concurrency``."""

    def __init__(self, keys: int = 0) -> None:
        """``keys``: how many gateway keys the config has; with two or more, the slots of
        upstreams and models are shared between keys (``per_key_share``)."""
        self.per_key: dict[str, int] = {}
        self.shared = keys >= 2

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

    def leave(self, policy: AdmissionPolicy, key_id: str | None) -> None:
        """Count the request out (``policy``: the one it entered under)."""
        if not policy.enabled or key_id is None or key_id not in self.per_key:
            return
        count = self.per_key[key_id] - 1
        if count:
            self.per_key[key_id] = count
        else:
            del self.per_key[key_id]


class ModelLimiters:
    """The limiters of public models with their own ``model_max_concurrency``, made on
    first use and kept across policy reloads (their queues and adaptive limits with them)."""

    def __init__(self) -> None:
        self.limiters: dict[str, Limiter] = {}

    def get(self, model: str, policy: AdmissionPolicy) -> Limiter | None:
        """``model``'s limiter, or None when it has no limit of its own."""
        limit = policy.model_max_concurrency.get(model) if policy.enabled else None
        if not limit:
            return None
        limiter = self.limiters.get(model)
        if limiter is None:
            limiter = Limiter(dataclasses.replace(policy, max_concurrency=limit))
            self.limiters[model] = limiter
        return limiter

    def update(self, policy: AdmissionPolicy) -> None:
        """A new policy: each limiter follows its model's new limit, state kept."""
        for name, limiter in self.limiters.items():
            limit = policy.model_max_concurrency.get(name)
            if limit:
                limiter.policy = dataclasses.replace(policy, max_concurrency=limit)
                limiter.limit = float(limit)
