"""TenantLRU: a tenant over its share evicts its own values, a full store the heaviest
tenant's; a value larger than a share is never kept."""

from __future__ import annotations

import pytest

from gateway.tenant_lru import TenantLRU


def test_a_tenant_over_its_share_evicts_its_own_least_recently_used() -> None:
    lru: TenantLRU[str] = TenantLRU(100, share=0.5)
    lru.put("a", "a1", "A1", 30)
    for i in range(5):
        lru.put("b", f"b{i}", f"B{i}", 20)
    assert lru.get("a1") == "A1"
    assert [k for k, _ in lru.items() if k.startswith("b")] == ["b3", "b4"]  # 40 <= 50
    assert lru.tenant_bytes("b") == 40 and lru.nbytes == 70
    lru.get("b3")  # now b4 is b's least recently used
    assert lru.put("b", "b5", "B5", 20) == [("b4", "B4")]


def test_a_full_store_evicts_from_the_tenant_holding_the_most() -> None:
    lru: TenantLRU[int] = TenantLRU(100, share=1.0)
    lru.put("a", "a1", 1, 30)
    for i in range(10):
        lru.put("b", f"b{i}", i, 20)
    assert lru.peek("a1") == 1  # b held the most each time it wrote
    assert lru.tenant_bytes("b") == 60 and lru.nbytes == 90
    # a writes and still holds less than b: b gives up room, oldest first
    assert lru.put("a", "a2", 2, 20) == [("b7", 7)]
    # a holds the most once it writes again (50 + 20 to b's 40): its own goes
    assert lru.put("a", "a3", 3, 20) == [("a1", 1)]


def test_the_writer_gives_way_on_a_tie_and_values_count_too() -> None:
    lru: TenantLRU[int] = TenantLRU(10**6, share=1.0, max_items=4)
    lru.put("a", "a1", 1, 1)
    lru.put("a", "a2", 2, 1)
    lru.put("b", "b1", 1, 1)
    lru.put("b", "b2", 2, 1)
    assert lru.put("b", "b3", 3, 1) == [("b1", 1)]  # b: 3 values to a's 2
    assert len(lru) == 4 and "a1" in lru
    shared: TenantLRU[int] = TenantLRU(10**6, share=0.5, max_items=4)
    for i in range(5):
        shared.put("b", f"b{i}", i, 1)
    assert len(shared) == 2  # b's share of the values: 2


def test_a_value_larger_than_a_share_is_not_kept_and_costs_nobody() -> None:
    lru: TenantLRU[str] = TenantLRU(100, share=0.25)
    lru.put("a", "a1", "x", 20)
    assert lru.put("a", "big", "y", 26) == [("big", "y")]
    assert "big" not in lru and lru.peek("a1") == "x" and lru.nbytes == 20


def test_replacing_and_popping_keep_the_counts() -> None:
    lru: TenantLRU[str] = TenantLRU(100)
    lru.put("a", "k", "old", 40)
    lru.put("b", "k", "new", 10)  # another tenant's value under the key replaces it
    assert lru.tenant_bytes("a") == 0 and lru.tenant_bytes("b") == 10 and lru.nbytes == 10
    assert lru.pop("k") == "new" and lru.pop("k") is None
    assert len(lru) == 0 and lru.nbytes == 0 and list(lru.values()) == []
    with pytest.raises(ValueError):
        TenantLRU(100, share=0.0)
