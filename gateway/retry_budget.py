"""A retry budget: retries may add at most ``ratio`` extra load on top of first attempts.

Each first attempt deposits ``ratio`` tokens (capped at ``max_tokens``); each retry (another
attempt on the same or a fallback target) spends one; with no token left, the request fails
with what it has instead of retrying. Retries then cannot multiply the load on an upstream
that is already overloaded (Google SRE book, ch. 22 "Addressing Cascading Failures": per-
client retry budget of 10%; the token-bucket form as in Finagle's RetryBudget).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.schema import bounded

__all__ = ["RetryBudget", "RetryBudgetPolicy"]


@dataclass(frozen=True)
class RetryBudgetPolicy:
    #: Retries allowed per first attempt, on average (0.1 = at most 10% more load).
    ratio: float = bounded(0.1, ge=0.0, le=1.0)
    #: Tokens available at start and at most (lets low-traffic gateways still retry).
    max_tokens: float = bounded(10.0, ge=0.0)


class RetryBudget:
    def __init__(self, policy: RetryBudgetPolicy):
        self.policy = policy
        self.tokens = policy.max_tokens
        self.denied = 0

    def deposit(self) -> None:
        """One first attempt was made."""
        self.tokens = min(self.policy.max_tokens, self.tokens + self.policy.ratio)

    def withdraw(self) -> bool:
        """May one more retry be made? Spends a token when yes."""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.denied += 1
        return False
