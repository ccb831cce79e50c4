"""Circuit breaker transitions, on a clock the test controls."""

from __future__ import annotations

from gateway.breaker import Breaker, BreakerPolicy, State


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(**kw) -> tuple[Breaker, Clock]:
    clock = Clock()
    policy = BreakerPolicy(**{"min_requests": 4, "failure_rate": 0.5, "consecutive_failures": 3,
                              "open_ms": 1_000, "window_s": 10, **kw})
    return Breaker(policy, clock), clock


def test_opens_on_failure_rate_over_the_window():
    b, _ = breaker(consecutive_failures=100)
    for ok in (True, False, True, False):
        assert b.allow()
        b.record(ok)
    assert b.state is State.OPEN and not b.allow()


def test_old_outcomes_leave_the_window():
    b, clock = breaker(consecutive_failures=100)
    b.record(False), b.record(False)
    clock.now += 11
    b.record(True), b.record(True), b.record(False), b.record(True)
    assert b.state is State.CLOSED


def test_opens_on_a_burst_of_consecutive_failures():
    b, _ = breaker(min_requests=100)
    for _ in range(3):
        b.record(False)
    assert b.state is State.OPEN


def test_half_open_probe_closes_on_success():
    b, clock = breaker()
    for _ in range(3):
        b.record(False)
    assert b.retry_after_s() == 1.0
    clock.now += 1.0
    assert b.state is State.HALF_OPEN
    assert b.allow() and not b.allow()  # one probe at a time
    b.record(True)
    assert b.state is State.CLOSED and b.allow()


def test_half_open_probe_failure_opens_again():
    b, clock = breaker()
    for _ in range(3):
        b.record(False)
    clock.now += 1.0
    assert b.allow()
    b.record(False)
    assert b.state is State.OPEN and b.opened == 2


def test_retry_after_keeps_it_open_longer():
    b, clock = breaker()
    for _ in range(2):
        b.record(False)
    b.record(False, retry_after_ms=30_000)
    clock.now += 1.0
    assert b.state is State.OPEN
    assert b.retry_after_s() == 29.0


def test_a_probe_that_never_reports_back_is_replaced():
    b, clock = breaker()
    for _ in range(3):
        b.record(False)
    clock.now += 1.0
    assert b.allow()  # the probe's client goes away: no record()
    clock.now += 1.5
    assert b.allow()


def test_disabled_breaker_always_allows():
    b, _ = breaker(enabled=False)
    for _ in range(10):
        b.record(False)
    assert b.allow()
