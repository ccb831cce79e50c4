"""The request pipeline: the stages the policy names, in its order, then dispatch.

A stage (:class:`~gateway.context.Stage`) is an object with one method, middleware style::

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply

It may answer by itself (a cache hit, a shed answer), change the context before calling
the next (choose the model to serve), or look at the reply that comes back (store it,
release a slot when it ends). Stages know nothing of each other: they read the context and
the policy snapshot it carries.

Which stages exist, what each is built from and which must run before which is the stage
table, :mod:`gateway.stage_table`. The policy names the order::

    [pipeline]
    stages = ["cache", "route", "admission"]
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable

from gateway.context import Next, Reply, RequestContext, Stage
from gateway.policy import Policy
from gateway.stage_table import STAGES, Services, check_stages

__all__ = ["Pipeline"]


class Pipeline:
    """The stages of one policy composed around the terminal step; built once per policy
    load, so a live reload swaps it whole. Calling it runs one request.

    Raises ValueError (see :func:`~gateway.stage_table.check_stages`) for a stage list the
    table rejects."""

    __slots__ = ("_handler", "aliases", "names")

    def __init__(self, policy: Policy, services: Services, terminal: Next) -> None:
        self.names = policy.pipeline.stages
        check_stages(self.names)
        built = ((name, STAGES[name].build(policy, services)) for name in self.names)
        stages: list[Stage] = [_Timed(name, stage) if services.traced else stage
                               for name, stage in built if stage is not None]
        #: Model names that a stage serves beyond the configured models (router aliases).
        self.aliases: frozenset[str] = frozenset().union(
            *(getattr(s.stage if isinstance(s, _Timed) else s, "aliases", frozenset())
              for s in stages))
        handler = terminal
        for stage in reversed(stages):
            handler = functools.partial(stage.__call__, call_next=handler)
        self._handler: Next = handler

    def __call__(self, ctx: RequestContext) -> Awaitable[Reply]:
        return self._handler(ctx)


class _Timed:
    """A stage timed for the request's trace (only when tracing is on; gateway.tracing):
    from its start to its handing on to the next, or to its own answer."""

    __slots__ = ("name", "stage")

    def __init__(self, name: str, stage: Stage) -> None:
        self.name, self.stage = name, stage

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        trace = ctx.trace
        if trace is None:  # not sampled
            return await self.stage(ctx, call_next)
        mark = trace.stage_started(self.name)

        def handing_on(ctx: RequestContext) -> Awaitable[Reply]:
            trace.stage_ended(mark)
            return call_next(ctx)
        try:
            return await self.stage(ctx, handing_on)
        finally:
            trace.stage_ended(mark)
