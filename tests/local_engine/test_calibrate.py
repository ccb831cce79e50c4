"""The latency-bounded batch: the rule on given step times, and the probe on a real engine."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from local_engine import calibrate
from local_engine.calibrate import latency_bounded_batch
from local_engine.engine import Engine, EngineConfig


def given(step_ms: dict[int, float], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Probes answer with ``step_ms``; returns the batch sizes probed."""
    probed: list[int] = []

    def fake(engine: object, batch: int, rng: random.Random) -> float:
        probed.append(batch)
        return step_ms[batch]
    monkeypatch.setattr(calibrate, "decode_step_ms", fake)
    monkeypatch.setattr(calibrate, "prefill_ms_per_token", lambda engine, rng: 0.5)
    return probed


def idle(max_num_seqs: int) -> Engine:
    return SimpleNamespace(config=EngineConfig(max_num_seqs=max_num_seqs),  # type: ignore
                           blocks=SimpleNamespace())


@pytest.mark.parametrize(("slowdown", "batch"), [
    (1.5, 13),   # 75 ms allowed: 16 is over (80); 1 + (75 - 50) / 2 ms per sequence
    (2.0, 24),   # 100 ms allowed: 16 is in, 32 over (120); 16 + (100 - 80) / 2.5
    (2.4, 32),   # 120 ms allowed: all of them
    (1.01, 1),   # nothing but a lone sequence within 1% of its own step
])
def test_the_largest_batch_within_the_slowdown(slowdown: float, batch: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    probed = given({1: 50.0, 16: 80.0, 32: 120.0}, monkeypatch)
    found = latency_bounded_batch(idle(32), slowdown)
    assert found.batch == batch
    assert found.step_ms == {1: 50.0, 16: 80.0, 32: 120.0}
    assert probed == [1, 16, 32, 1, 16, 32]  # twice, the fastest kept


def test_the_rates_are_the_prefill_and_the_decode_step_at_the_batch_found(
        monkeypatch: pytest.MonkeyPatch) -> None:
    given({1: 50.0, 16: 80.0, 32: 120.0}, monkeypatch)
    found = latency_bounded_batch(idle(32), 2.0)  # 24: 80 + (120 - 80) * 8 / 16 ms a step
    assert found.rates() == {"prefill_ms_per_token": 0.5, "decode_ms_per_token": 100.0}
    assert latency_bounded_batch(idle(32), 0).rates() is None  # not probed


def test_a_gpu_like_flat_step_fills_every_seat(monkeypatch: pytest.MonkeyPatch) -> None:
    given({1: 5.0, 64: 5.1, 128: 5.3}, monkeypatch)
    assert latency_bounded_batch(idle(128), 1.5).batch == 128


def test_no_probe_when_off_or_one_seat(monkeypatch: pytest.MonkeyPatch) -> None:
    probed = given({}, monkeypatch)
    assert latency_bounded_batch(idle(32), 0).batch == 32
    assert latency_bounded_batch(idle(1), 1.5).batch == 1
    assert probed == []


def test_the_probe_leaves_the_engine_idle_and_its_counters_clean(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(max_num_seqs=8)
    free = engine.blocks.num_free
    found = latency_bounded_batch(engine, 1.5)
    assert 1 <= found.batch <= 8 and set(found.step_ms) == {1, 4, 8}
    assert all(ms > 0 for ms in found.step_ms.values())
    rates = found.rates()
    assert rates is not None and rates["prefill_ms_per_token"] > 0
    assert not engine.has_work()
    assert (engine.decodes, engine.decode_tokens) == (0, 0)
    assert (engine.blocks.hits, engine.blocks.lookups) == (0, 0)  # prefix-cache figures
    assert engine.blocks.num_free == free
