"""Backoff and Retry-After arithmetic (the retry behaviour itself is tested end to end in
test_proxy.py)."""

from __future__ import annotations

import email.utils
import time

import pytest

from gateway.dispatch import backoff_ms
from gateway.http import retry_after_ms
from gateway.policy import RetryPolicy


def test_full_jitter_backoff_is_bounded_by_the_capped_exponential():
    policy = RetryPolicy(base_delay_ms=100, max_delay_ms=1000)
    assert [backoff_ms(n, policy, lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [
        100, 200, 400, 800, 1000]
    assert backoff_ms(3, policy, lambda: 0.0) == 0
    assert backoff_ms(3, policy, lambda: 0.5) == 200


@pytest.mark.parametrize(("headers", "expected"), [
    ([], None),
    ([(b"retry-after", b"2")], 2000.0),
    ([(b"Retry-After", b"0.5")], 500.0),
    ([(b"retry-after-ms", b"150")], 150.0),
    ([(b"retry-after", b"9"), (b"retry-after-ms", b"20")], 20.0),
    ([(b"retry-after", b"-3")], 0.0),
])
def test_retry_after_forms(headers, expected):
    assert retry_after_ms(headers) == expected


def test_retry_after_http_date():
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    ms = retry_after_ms([(b"retry-after", when.encode())])
    assert ms is not None and 28_000 <= ms <= 30_000
