"""What the prompt_cache stage remembers between requests: fingerprints, never text.

Two bounded LRU tables, both scoped by the gateway key (one key's requests never inform
another's):

- **Line variants**, per family (gateway key, requested model): the line fingerprints of
  the recent system prompts (:func:`gateway.prompt_cache.volatile.fingerprints`), at most
  ``variants`` distinct prompts a family, and how many times each line was seen to change.
  :meth:`PromptMemory.changed_lines` compares a new prompt with a variant it is otherwise
  identical to: as many lines, exactly one of them different, line for line. That line
  counts one change; a line seen to change :data:`EVIDENCE` times is volatile, and stays
  volatile while the prompt around it stays the same. One change may be an edit of the
  prompt and is not evidence; two prompts that differ in two lines (two agents of one key,
  a heading and a line apart; a clock and another line changing at once) are two variants,
  and neither line counts. A prompt seen before, every line alike (:meth:`PromptMemory.recall`),
  is evidence the other way: its metadata lines hold still (a date line all day, the clock
  line of a recorded agent), so they stay where they are.
- **Cached prefixes**, per key: the fingerprint of each prefix the gateway asked Anthropic to
  cache (a hash chain over its blocks, :mod:`gateway.prompt_cache.breakpoints`) and when it
  was last sent, for the 20-block lookback and the ``auto`` TTL. Shared by the keys as
  :class:`~gateway.tenant_lru.TenantLRU` shares memory: a full table forgets the prefixes
  of the key holding the most, so one key's flood of prefixes forgets its own. (Families
  need no such share: a key has one per model it can name.)

Everything runs on the event loop: no locks. ``clock`` (seconds, monotonic) is injectable
for tests.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from gateway.tenant_lru import TenantLRU

__all__ = ["EVIDENCE", "PromptMemory"]


#: Changes a line must be seen to make before it counts as volatile.
EVIDENCE = 2


@dataclass(slots=True)
class _Variant:
    lines: array[int]  # line fingerprints, int64
    tail: int  # the fingerprint of the lines past max_lines
    changes: dict[int, int]  # line index -> times seen to change


class PromptMemory:
    """``families``: families kept (LRU); ``variants``: prefixes kept a family; ``max_lines``:
    lines compared one by one (the rest as one); ``prefixes``: cached-prefix
    fingerprints kept across all keys (LRU)."""

    def __init__(self, *, families: int = 2048, variants: int = 4, max_lines: int = 512,
                 prefixes: int = 16384, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._families: OrderedDict[Hashable, list[_Variant]] = OrderedDict()
        self._prefixes: TenantLRU[float] = TenantLRU(prefixes)  # each counts 1
        self._max_families = families
        self._max_variants = variants
        self._max_lines = max_lines

    # -- volatile lines ---------------------------------------------------------------------

    def changed_lines(self, family: Hashable, lines: Sequence[int]) -> frozenset[int]:
        """The fingerprints among ``lines`` of lines seen to change (:data:`EVIDENCE` times),
        and remembers ``lines`` for the family's next request."""
        return self.recall(family, lines)[0]

    def recall(self, family: Hashable, lines: Sequence[int]) -> tuple[frozenset[int], bool]:
        """:meth:`changed_lines`, and whether this very prompt (every line alike) was seen
        before in the family: evidence that its lines hold still."""
        new = array("q", lines[: self._max_lines])
        tail = hash(tuple(lines[self._max_lines:]))  # the rest must be the same, as a whole
        variants = self._families.get(family)
        if variants is None:
            variants = []
            self._families[family] = variants
            if len(self._families) > self._max_families:
                self._families.popitem(last=False)
        else:
            self._families.move_to_end(family)
        best, changed = _closest(variants, new, tail)
        seen = best is not None and changed is None
        changes: dict[int, int] = {}
        if best is not None:
            variants.remove(best)
            changes = dict(best.changes)
            if changed is not None:
                changes[changed] = changes.get(changed, 0) + 1
        variants.insert(0, _Variant(new, tail, changes))
        del variants[self._max_variants:]
        return frozenset(new[j] for j, n in changes.items() if n >= EVIDENCE), seen

    # -- cached prefixes --------------------------------------------------------------------

    def last_seen(self, key: str | None, prefix: int) -> float | None:
        """When the gateway last had ``prefix`` cached for ``key`` (clock seconds), or None."""
        return self._prefixes.peek(_named(key, prefix))

    def remember(self, key: str | None, prefixes: Iterable[int]) -> None:
        """``prefixes`` were sent with cache markers for ``key`` now."""
        now = self.clock()
        for prefix in prefixes:
            self._prefixes.put(key or "", _named(key, prefix), now, 1)


def _named(key: str | None, prefix: int) -> str:
    """A key's prefix as one name, unambiguously (``None``, no keys, apart from ``""``)."""
    return f"{prefix}" if key is None else f"{prefix}:{key}"


def _closest(variants: list[_Variant], new: array[int], tail: int
             ) -> tuple[_Variant | None, int | None]:
    """The variant ``new`` is otherwise identical to (the module docstring), and the line
    where they differ (None: the same prompt)."""
    best: tuple[_Variant | None, int | None] = (None, None)
    for variant in variants:
        if len(variant.lines) != len(new) or variant.tail != tail:
            continue
        if variant.lines == new:
            return variant, None
        if best[0] is None:
            changed = _one_difference(variant.lines, new)
            if changed is not None:
                best = (variant, changed)
    return best


def _one_difference(a: array[int], b: array[int]) -> int | None:
    """The index of the one line where ``a`` and ``b`` (as long) differ; None for several."""
    found = None
    for j, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            if found is not None:
                return None
            found = j
    return found
