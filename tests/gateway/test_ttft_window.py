"""The learned first-token deadline (gateway.ttft_window): a percentile of the target's
recent first tokens times a factor, never under the floor, none while the target is cold,
longer for a request larger than usual."""

from __future__ import annotations

from gateway.ttft_window import TtftWindow


def filled(times: list[float], size: int = 1000) -> TtftWindow:
    window = TtftWindow()
    for ms in times:
        window.add(ms, size)
    return window


def test_no_deadline_until_enough_samples() -> None:
    window = filled([100.0] * 49)
    assert window.deadline_ms(1000, 0.99, 3.0, 0.0, 50) is None
    window.add(100.0, 1000)
    assert window.deadline_ms(1000, 0.99, 3.0, 0.0, 50) == 300.0


def test_the_percentile_times_the_factor_and_the_floor() -> None:
    window = filled([float(ms) for ms in range(1, 101)])  # 1..100 ms
    assert window.deadline_ms(1000, 0.99, 3.0, 0.0, 50) == 3 * 99.0
    assert window.deadline_ms(1000, 0.5, 2.0, 0.0, 50) == 2 * 50.0
    assert window.deadline_ms(1000, 0.99, 3.0, 5000.0, 50) == 5000.0
    assert window.deadline_ms(1000, 0.99, 0.0, 0.0, 50) is None  # factor 0: none


def test_a_larger_request_than_usual_gets_a_longer_deadline() -> None:
    window = filled([100.0] * 60, size=1000)
    assert window.deadline_ms(500, 0.99, 3.0, 0.0, 50) == 300.0  # smaller: not shorter
    assert window.deadline_ms(4000, 0.99, 3.0, 0.0, 50) == 1200.0


def test_the_window_keeps_the_last_samples_only() -> None:
    window = filled([10_000.0] * TtftWindow.SIZE)
    for _ in range(TtftWindow.SIZE):
        window.add(100.0, 1000)
    assert len(window) == TtftWindow.SIZE
    assert window.deadline_ms(1000, 0.99, 3.0, 0.0, 50) == 300.0


def test_the_percentile_is_of_the_requests_nearest_in_size() -> None:
    """A fast kind's tail is cut by its own percentile, not by a slow kind's."""
    window = TtftWindow()
    for k in range(100):
        window.add(100.0 + k % 10, 2000)  # chat turns: ~100 ms
        window.add(1000.0 + k % 10, 20_000)  # retrieval prompts: ~1 s
    assert window.deadline_ms(2000, 0.95, 2.0, 0.0, 50) == 2 * 109.0
    assert window.deadline_ms(20_000, 0.95, 2.0, 0.0, 50) == 2 * 1009.0
    assert window.deadline_ms(40_000, 0.95, 2.0, 0.0, 50) == 2 * 1009.0 * 2  # larger: scaled
