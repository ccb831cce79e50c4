"""What the prompt_cache stage remembers between requests: fingerprints, never text.

Two bounded LRU tables, both scoped by the gateway key (one key's requests never inform
another's):

- **Line variants**, per family (gateway key, requested model): the fingerprints of the
  recent static prefixes' lines (:func:`gateway.prompt_cache.volatile.line_hashes`), at most
  ``variants`` distinct prefixes a family, and which of their lines were seen to change.
  :meth:`PromptMemory.changed_lines` aligns a new prefix with its most similar variant
  (``difflib.SequenceMatcher`` over the fingerprints): lines replaced one for one while most
  others stay are volatile, and stay volatile in later requests (their new content is
  aligned with the old, so a line that changes only now and then keeps leaving).
- **Cached prefixes**, per key: the fingerprint of each prefix the gateway asked Anthropic to
  cache (a hash chain over its blocks, :mod:`gateway.prompt_cache.breakpoints`) and when it
  was last sent, for the 20-block lookback and the ``auto`` TTL.

Everything runs on the event loop: no locks. ``clock`` (seconds, monotonic) is injectable
for tests.
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

__all__ = ["PromptMemory"]


@dataclass(slots=True)
class _Variant:
    lines: array[int]  # line fingerprints, int64
    volatile: frozenset[int]  # indices into lines


class PromptMemory:
    """``families``: families kept (LRU); ``variants``: prefixes kept a family; ``max_lines``:
    lines compared a prefix (the rest are not tracked); ``prefixes``: cached-prefix
    fingerprints kept across all keys (LRU)."""

    def __init__(self, *, families: int = 2048, variants: int = 4, max_lines: int = 512,
                 prefixes: int = 16384, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._families: OrderedDict[Hashable, list[_Variant]] = OrderedDict()
        self._prefixes: OrderedDict[tuple[str | None, int], float] = OrderedDict()
        self._max_families = families
        self._max_variants = variants
        self._max_lines = max_lines
        self._max_prefixes = prefixes

    # -- volatile lines ---------------------------------------------------------------------

    def changed_lines(self, family: Hashable, lines: Sequence[int]) -> frozenset[int]:
        """The fingerprints among ``lines`` of lines found to change, and remembers
        ``lines`` for the family's next request. A prefix is compared with the family's
        variant sharing most lines, if it shares at least half of them; a change is a run of
        lines replaced by as many lines, in all at most a quarter of the prefix (or 2 lines),
        else it is an edit and nothing new is flagged."""
        new = array("q", lines[: self._max_lines])
        variants = self._families.get(family)
        if variants is None:
            variants = []
            self._families[family] = variants
            if len(self._families) > self._max_families:
                self._families.popitem(last=False)
        else:
            self._families.move_to_end(family)
        best = self._closest(variants, new)
        volatile = frozenset() if best is None else _align(best, new)
        if best is not None:
            variants.remove(best)
        variants.insert(0, _Variant(new, volatile))
        del variants[self._max_variants:]
        return frozenset(new[j] for j in volatile)

    @staticmethod
    def _closest(variants: list[_Variant], new: array[int]) -> _Variant | None:
        for variant in variants:
            if variant.lines == new:
                return variant
        if not new:
            return None
        mine = set(new)
        best, shared = None, 0
        for variant in variants:
            n = len(mine.intersection(variant.lines))
            if n > shared:
                best, shared = variant, n
        return best if shared * 2 >= len(mine) else None

    # -- cached prefixes --------------------------------------------------------------------

    def last_seen(self, key: str | None, prefix: int) -> float | None:
        """When the gateway last had ``prefix`` cached for ``key`` (clock seconds), or None."""
        return self._prefixes.get((key, prefix))

    def remember(self, key: str | None, prefixes: Iterable[int]) -> None:
        """``prefixes`` were sent with cache markers for ``key`` now."""
        now = self.clock()
        table = self._prefixes
        for prefix in prefixes:
            table[(key, prefix)] = now
            table.move_to_end((key, prefix))
        while len(table) > self._max_prefixes:
            table.popitem(last=False)


def _align(old: _Variant, new: array[int]) -> frozenset[int]:
    """Indices of ``new`` that are volatile: aligned with a volatile line of ``old``, or
    replacing one of its lines one for one."""
    if old.lines == new:
        return old.volatile
    carried: set[int] = set()
    replaced: list[int] = []
    matcher = SequenceMatcher(None, old.lines, new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            carried.update(j1 + k for k in range(i2 - i1) if i1 + k in old.volatile)
        elif op == "replace" and i2 - i1 == j2 - j1:
            replaced.extend(range(j1, j2))
    if len(replaced) > max(2, len(new) // 4):
        return frozenset(carried)  # an edit of the prompt, not a volatile line
    return frozenset(carried.union(replaced))
