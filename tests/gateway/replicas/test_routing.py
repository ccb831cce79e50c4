"""The pool's routing policies, as the gateway runs them (bench/replicas.py runs them too)."""

from __future__ import annotations

from gateway.replicas.prefix import PrefixIndex, byte_keys, render
from gateway.replicas.routing import Replica, make_router


def _chat(*turns: str, model: str = "m", stream: bool = False) -> bytes:
    messages = [{"role": "system", "content": "You are a travel agent. " * 20}]
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
                 for i, t in enumerate(turns)]
    return render({"model": model, "stream": stream, "messages": messages})


def test_a_longer_conversation_shares_its_earlier_turns_blocks() -> None:
    one, two = byte_keys(_chat("book a flight"), 32), byte_keys(
        _chat("book a flight", "where to?", "Paris", model="other", stream=True), 32)
    assert len(one) > 5 and two[:len(one)] == one
    assert byte_keys(_chat("cancel my booking, please " * 3), 32)[-1] not in two


def test_the_index_evicts_least_recently_used_beyond_its_capacity() -> None:
    index = PrefixIndex(capacity=3)
    index.add([1, 2, 3])
    index.add([1])  # used again: now the most recent
    assert index.add([4]) == [2]
    assert index.match([1, 2, 3]) == 1 and index.match([4]) == 1


def test_round_robin_and_least_load() -> None:
    pool = [Replica("a"), Replica("b"), Replica("c")]
    rr = make_router("round_robin")
    assert [rr.order(pool, [])[0].name for _ in range(4)] == ["a", "b", "c", "a"]
    pool[0].in_flight, pool[1].reported, pool[2].in_flight = 3, 1, 2
    assert [r.name for r in make_router("least_load").order(pool, [])] == ["b", "c", "a"]


def test_prefix_keeps_a_conversation_on_the_replica_holding_it() -> None:
    pool = [Replica(n, capacity_blocks=1000) for n in "abcd"]
    router = make_router("prefix")
    first = router.order(pool, byte_keys(_chat("book a flight"), 32))[0]
    first.in_flight += 1  # still running: the pool is not empty anymore
    later = router.order(pool, byte_keys(_chat("book a flight", "where?", "Paris"), 32))[0]
    assert later is first
    other = router.order(pool, byte_keys(render({"messages": [
        {"role": "user", "content": "a different prompt entirely " * 10}]}), 32))[0]
    assert other is not first  # held nowhere: the least loaded


def test_an_imbalanced_pool_sends_even_a_cached_prefix_to_the_least_loaded() -> None:
    pool = [Replica(n, capacity_blocks=1000) for n in "ab"]
    router = make_router("prefix", balance_abs_threshold=4, balance_rel_threshold=1.5)
    keys = byte_keys(_chat("hello"), 32)
    hot = router.order(pool, keys)[0]
    hot.in_flight = 10
    assert router.order(pool, keys)[0] is not hot


def test_prefix_precise_scores_what_the_engines_report_and_what_was_just_sent() -> None:
    now = [0.0]
    pool = [Replica(n) for n in "ab"]
    router = make_router("prefix_precise", pending_s=2.0, clock=lambda: now[0])
    keys = [11, 12, 13, 14]
    pool[1].held.add(keys[:3])  # b's engine reported these blocks
    assert router.order(pool, keys)[0].name == "b"
    pool[1].held.clear()  # evicted; but b was sent them just now: pending for 2 s
    assert router.order(pool, keys)[0].name == "b"
    now[0] = 5.0  # no report confirmed them: they no longer count
    pool[1].in_flight = 1
    assert router.order(pool, keys)[0].name == "a"


def test_a_replica_back_from_ejection_ramps_up_without_turning_prefix_routing_off() -> None:
    pool = [Replica(n, capacity_blocks=1000) for n in "ab"]
    router = make_router("prefix")
    keys = byte_keys(_chat("a long conversation"), 32)
    holder = router.order(pool, keys)[0]
    other = pool[1] if holder is pool[0] else pool[0]
    holder.weight = 0.1  # just back from an ejection
    assert router.order(pool, keys)[0] is holder  # its conversation still goes to it
    fresh = byte_keys(render({"messages": [{"role": "user", "content": "new " * 40}]}), 32)
    assert router.order(pool, fresh)[0] is other  # equal loads: the ramping one last
    holder.weight, other.in_flight = 1.0, 1
    assert router.order(pool, byte_keys(render({"messages": [
        {"role": "user", "content": "other " * 40}]}), 32))[0] is holder
