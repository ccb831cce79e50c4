"""The prompt_cache memory: lines seen to change, per family; cached prefixes, per key."""

from __future__ import annotations

from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.volatile import line_hashes

BASE = [f"Rule {chr(65 + i)}: be helpful in way {chr(65 + i)}." for i in range(16)]
FAMILY = ("key-a", "model")


def prompt(**changes: str) -> list[str]:
    """BASE with some lines (by index, as ``l3="..."``) replaced."""
    lines = list(BASE)
    for name, text in changes.items():
        lines[int(name[1:])] = text
    return lines


def flagged(memory: PromptMemory, lines: list[str], family: object = FAMILY) -> set[str]:
    """The lines ``memory`` finds volatile in this request."""
    found = memory.changed_lines(family, line_hashes("system", lines))
    return {line for line in lines if hash(("system", line)) in found}


def test_a_line_that_changes_while_the_rest_stays_is_volatile_and_stays_so():
    memory = PromptMemory()
    assert flagged(memory, prompt(l2="Weather: sunny")) == set()  # nothing to compare with
    assert flagged(memory, prompt(l2="Weather: rain")) == {"Weather: rain"}
    # Unchanged now, but it changed before: it keeps leaving (the prefix stays the same).
    assert flagged(memory, prompt(l2="Weather: rain")) == {"Weather: rain"}
    assert flagged(memory, prompt(l2="Weather: snow")) == {"Weather: snow"}


def test_several_separate_lines_and_adjacent_ones():
    memory = PromptMemory()
    flagged(memory, prompt(l1="a1", l2="b1", l6="c1"))
    assert flagged(memory, prompt(l1="a2", l2="b2", l6="c2")) == {"a2", "b2", "c2"}


def test_an_edit_of_many_lines_is_not_volatility():
    memory = PromptMemory()
    flagged(memory, BASE)
    edited = prompt(l0="x0", l1="x1", l2="x2", l7="x7", l9="x9")  # more than a quarter
    assert flagged(memory, edited) == set()


def test_an_insertion_is_not_volatility():
    memory = PromptMemory()
    flagged(memory, BASE)
    assert flagged(memory, [*BASE[:4], "A new rule.", *BASE[4:]]) == set()


def test_a_family_keeps_several_prompts_and_compares_with_the_closest():
    memory = PromptMemory()
    other = [f"Agent two, rule {i}." for i in range(16)]
    flagged(memory, prompt(l3="t1"))
    flagged(memory, other)  # another agent of the same key and model, in between
    assert flagged(memory, prompt(l3="t2")) == {"t2"}
    assert flagged(memory, [*other[:5], "changed", *other[6:]]) == {"changed"}


def test_families_never_share_what_they_saw():
    memory = PromptMemory()
    flagged(memory, prompt(l2="Weather: sunny"), ("key-a", "m"))
    flagged(memory, prompt(l2="Weather: rain"), ("key-a", "m"))
    # Another key (or model) with the same lines starts from nothing.
    assert flagged(memory, prompt(l2="Weather: rain"), ("key-b", "m")) == set()
    assert flagged(memory, prompt(l2="Weather: rain"), ("key-a", "m2")) == set()


def test_the_tables_are_bounded():
    memory = PromptMemory(families=2, variants=1, prefixes=3)
    flagged(memory, prompt(l2="v1"), "f1")
    flagged(memory, BASE, "f2")
    flagged(memory, BASE, "f3")  # f1 is forgotten
    assert flagged(memory, prompt(l2="v2"), "f1") == set()
    for prefix in range(5):
        memory.remember("k", [prefix])
    assert [memory.last_seen("k", p) is not None for p in range(5)] == [False, False, True,
                                                                         True, True]


def test_cached_prefixes_are_per_key_with_the_time_they_were_sent():
    now = [100.0]
    memory = PromptMemory(clock=lambda: now[0])
    memory.remember("a", [11, 12])
    now[0] = 400.0
    memory.remember("a", [12])
    assert memory.last_seen("a", 11) == 100.0 and memory.last_seen("a", 12) == 400.0
    assert memory.last_seen("b", 11) is None
    assert memory.last_seen(None, 11) is None
