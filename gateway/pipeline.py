"""The request pipeline: the stages the policy names, in its order, then dispatch.

A stage is an object with one method, middleware style::

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply

It may answer by itself (a cache hit, a shed answer), change the context before calling
the next (choose the model to serve), or look at the reply that comes back (store it,
release a slot when it ends). Stages know nothing of each other: they read the context and
the policy snapshot it carries.

Each stage is a module ``gateway/stages/NAME.py`` that defines ``build(gateway, policy) ->
Stage | None`` (None: nothing to do under this policy, e.g. the cache stage when the gateway
has no cache; the stage is then left out of the chain)
and, optionally, ``AFTER``: the names of stages that must run before it when both are in the
pipeline (admission needs the model the route stage chose). The policy names the order::

    [pipeline]
    stages = ["cache", "route", "admission"]

:func:`check_stages` rejects unknown names, duplicates and impossible orders (at start-up,
in ``gateway check`` and on live reload, where the old pipeline keeps serving).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from gateway.context import Reply, RequestContext

if TYPE_CHECKING:
    from gateway.policy import Policy
    from gateway.state import Gateway

__all__ = ["Next", "Pipeline", "Stage", "check_stages", "known_stages"]

Next = Callable[[RequestContext], Awaitable[Reply]]

_NAME = re.compile(r"[a-z][a-z0-9_]*")


class Stage(Protocol):
    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...


def known_stages() -> list[str]:
    """The stage modules that exist (``gateway/stages/*.py``), sorted."""
    import gateway.stages

    return sorted(m.name for m in pkgutil.iter_modules(gateway.stages.__path__)
                  if not m.name.startswith("_"))


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"gateway.stages.{name}")


def check_stages(names: Sequence[str]) -> None:
    """Raises ValueError naming the problem: an unknown stage, a duplicate, or a stage
    listed before one that must run first."""
    known = known_stages()
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not _NAME.fullmatch(name) or name not in known:
            raise ValueError(f"stages[{i}]: unknown stage {name!r}; known stages: "
                             f"{', '.join(known)}")
        if name in seen:
            raise ValueError(f"stages[{i}]: {name!r} is listed twice")
        seen.add(name)
    for i, name in enumerate(names):
        for before in getattr(_module(name), "AFTER", ()):
            if before in names[i + 1:]:
                raise ValueError(f"stages[{i}]: {name!r} must come after {before!r}")


class Pipeline:
    """The stages of one policy composed around the terminal step; built once per policy
    load, so a live reload swaps it whole. Calling it runs one request."""

    __slots__ = ("_handler", "aliases", "names")

    def __init__(self, policy: Policy, gateway: Gateway, terminal: Next) -> None:
        self.names = policy.pipeline.stages
        built = (_module(name).build(gateway, policy) for name in self.names)
        stages: list[Stage] = [stage for stage in built if stage is not None]
        #: Model names that a stage serves beyond the configured models (router aliases).
        self.aliases: frozenset[str] = frozenset().union(
            *(getattr(s, "aliases", frozenset()) for s in stages))
        handler = terminal
        for stage in reversed(stages):
            handler = functools.partial(stage.__call__, call_next=handler)
        self._handler: Next = handler

    def __call__(self, ctx: RequestContext) -> Awaitable[Reply]:
        return self._handler(ctx)
