"""The prompt_cache memory: lines seen to change, per family; cached prefixes, per key."""

from __future__ import annotations

from gateway.prompt_cache.memory import PromptMemory
from gateway.prompt_cache.volatile import fingerprints

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
    found = memory.changed_lines(family, fingerprints(["\n".join(lines)]))
    return {line for line in lines if hash(line) in found}


def test_a_line_seen_to_change_twice_is_volatile_and_stays_so():
    memory = PromptMemory()
    assert flagged(memory, prompt(l2="Weather: sunny")) == set()  # nothing to compare with
    assert flagged(memory, prompt(l2="Weather: rain")) == set()  # one change: an edit?
    assert flagged(memory, prompt(l2="Weather: snow")) == {"Weather: snow"}
    # Unchanged now, but it changed before: it keeps leaving (the prefix stays the same).
    assert flagged(memory, prompt(l2="Weather: snow")) == {"Weather: snow"}
    assert flagged(memory, prompt(l2="Weather: fog")) == {"Weather: fog"}


def test_a_one_off_edit_is_not_volatility():
    memory = PromptMemory()
    flagged(memory, BASE)
    for _ in range(3):  # the edited prompt, again and again
        assert flagged(memory, prompt(l4="Rule E: be terse.")) == set()


def test_lines_that_change_together_are_two_prompts_not_volatility():
    memory = PromptMemory()
    for n in range(4):  # two agents of one key: a heading and a line apart, taking turns
        agent = n % 2
        assert flagged(memory, prompt(l0=f"# Agent {agent}", l2=f"Weather: {agent}")) == set()
    for n in range(3):  # two lines changing at once, every time
        assert flagged(memory, prompt(l1=f"a{n}", l6=f"c{n}")) == set()


def test_only_an_otherwise_identical_prompt_is_compared():
    memory = PromptMemory()
    flagged(memory, BASE)
    flagged(memory, prompt(l0="x0"))
    # Several lines changed at once: an edit, a new variant.
    assert flagged(memory, prompt(l0="y0", l1="x1", l2="x2", l7="x7")) == set()
    # A line inserted: nothing lines up one for one.
    assert flagged(memory, [*BASE[:4], "A new rule.", *BASE[4:]]) == set()


def test_a_family_keeps_several_prompts_and_compares_with_the_closest():
    memory = PromptMemory()
    other = [f"Agent two, rule {i}." for i in range(16)]
    flagged(memory, prompt(l3="t1"))
    flagged(memory, prompt(l3="t2"))
    flagged(memory, other)  # another agent of the same key and model, in between
    assert flagged(memory, prompt(l3="t3")) == {"t3"}
    flagged(memory, [*other[:5], "changed", *other[6:]])
    assert flagged(memory, [*other[:5], "changed again", *other[6:]]) == {"changed again"}


def test_families_never_share_what_they_saw():
    memory = PromptMemory()
    for weather in ("sunny", "rain", "snow"):
        flagged(memory, prompt(l2=f"Weather: {weather}"), ("key-a", "m"))
    # Another key (or model) with the same lines starts from nothing.
    assert flagged(memory, prompt(l2="Weather: fog"), ("key-b", "m")) == set()
    assert flagged(memory, prompt(l2="Weather: fog"), ("key-a", "m2")) == set()


def test_lines_past_max_lines_are_compared_as_one():
    memory = PromptMemory(max_lines=4)
    for n in range(3):
        assert flagged(memory, prompt(l1=f"v{n}")) == ({"v2"} if n == 2 else set())
    # the tail differs: not the same prompt
    assert flagged(memory, prompt(l1="v3", l9="tail")) == set()


def test_the_tables_are_bounded():
    memory = PromptMemory(families=2, variants=1, prefixes=3)
    flagged(memory, prompt(l2="v1"), "f1")
    flagged(memory, prompt(l2="v2"), "f1")
    flagged(memory, BASE, "f2")
    flagged(memory, BASE, "f3")  # f1 is forgotten
    assert flagged(memory, prompt(l2="v3"), "f1") == set()
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


def test_one_keys_flood_of_prefixes_forgets_its_own():
    memory = PromptMemory(prefixes=8)
    memory.remember("a", [1, 2])
    for prefix in range(100, 200):
        memory.remember("b", [prefix])
    assert memory.last_seen("a", 1) is not None and memory.last_seen("a", 2) is not None
    assert memory.last_seen("b", 199) is not None and memory.last_seen("b", 100) is None
