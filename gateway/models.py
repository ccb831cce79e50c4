"""The models a gateway serves: public names, aliases and families by pattern -> each
model's ordered targets.

Built once from the :class:`~gateway.config.Config` (models do not change on a policy
reload). The endpoint resolves the requested model once, at the door, into the request's
``RequestContext.route`` (:meth:`ModelTable.get`: an exact name or alias, else the first
pattern by precedence, :mod:`gateway.model_patterns`); a stage that chooses another model to
serve (route, admission's reroute) resolves that one; the stages that need a model's
targets (compress, admission) and dispatch read the context's route.

A route resolved by a pattern is named after the id the client asked (``claude-haiku-4-5``:
the cache, coalescing and the log keep ids apart) and carries its entry's ``pattern``
(``claude-*``). What grows with the ids a client may invent is keyed by the pattern
instead: per-model policy tables (:func:`model_key`), learned per-model state, and metric
labels (:meth:`ModelRoute.metric_label`).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable, Iterator
from dataclasses import dataclass

from gateway.config import Config, Target
from gateway.errors import ModelNotFound
from gateway.model_patterns import ModelPattern, Template, by_precedence, is_pattern

__all__ = ["ModelRoute", "ModelTable", "model_key", "model_not_found"]

#: Pattern-resolved routes kept for reuse (by id); past it the memo starts over, so ids a
#: client invents cost memory up to this many routes.
MEMO_ROUTES = 1024


def model_not_found(name: str) -> ModelNotFound:
    """The 404 (``param: model``) for a model name the gateway does not serve."""
    return ModelNotFound(f"the model '{name[:256]}' does not exist on this gateway; "
                         "GET /v1/models lists the available models", param="model")


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A public model (``name``, its aliases resolved) and its ordered ``targets``. For an
    id a pattern entry resolved: ``name`` is the id as the client asked, ``targets`` carry
    the upstream models the entry's templates made of it, ``pattern`` is the entry's name
    (``claude-*``) and ``fixed`` the entry's targets' models that are no template."""

    name: str
    targets: tuple[Target, ...]
    pattern: str | None = None
    fixed: frozenset[str] = frozenset()

    def metric_label(self, served: str) -> str:
        """The ``model`` metric label of an answer that names ``served`` as its model: an
        exact entry's ``served`` (its targets' models come from the config), a pattern's
        own name unless ``served`` is one of its fixed models (never an id the client
        chose: metric labels stay bounded)."""
        if self.pattern is None or served in self.fixed:
            return served
        return self.pattern


def model_key(name: str, route: ModelRoute | None, listed: Container[str] = ()) -> str:
    """The key of the model ``name`` (a request's ``ctx.model`` or ``ctx.target``) in a
    per-model policy table or per-model state: ``name`` itself, unless ``route`` (``name``'s
    route) was resolved by a pattern and ``listed`` (the table's keys) does not hold
    ``name``: then the pattern's name as written (``claude-*``). So a table may name an id
    of a family (its own entry) or the family (shared by all its ids), and what is keyed
    by it stays as bounded as the config."""
    if route is None or route.pattern is None or route.name != name or name in listed:
        return name
    return route.pattern


_UNSEEN = ModelRoute("", ())  # the memo's "not resolved yet"


@dataclass(frozen=True, slots=True)
class _Family:
    pattern: ModelPattern
    targets: tuple[tuple[str, Template], ...]  # (upstream, model template)
    fixed: frozenset[str]


class ModelTable:
    """Public model names and aliases, and families by pattern -> the model's ordered
    targets."""

    def __init__(self, config: Config):
        #: Exact names and aliases -> their routes.
        self.routes: dict[str, ModelRoute] = {}
        self.names: list[str] = []
        families: list[_Family] = []
        #: Pattern entry -> the ids GET /v1/models lists for it.
        self.listed: dict[str, tuple[str, ...]] = {}
        for name, model in config.models.items():
            if is_pattern(name):
                pattern = ModelPattern(name)
                templates = tuple((t.upstream, Template(t.model or "{model}", pattern.stars))
                                  for t in model.targets)
                fixed = frozenset(t.literal for _, t in templates if t.literal is not None)
                families.append(_Family(pattern, templates, fixed))
                self.listed[name] = model.list
                continue
            route = ModelRoute(name, model.targets)
            self.names.append(name)
            for public in (name, *model.aliases):
                self.routes[public] = route
        order = by_precedence([f.pattern for f in families])
        #: The pattern entries, in the order they are tried.
        self.families = sorted(families, key=lambda f: order.index(f.pattern))
        self._memo: dict[str, ModelRoute | None] = {}

    def get(self, name: str) -> ModelRoute | None:
        """``name``'s route: an exact name or alias, else the first pattern that matches it
        (:mod:`gateway.model_patterns` precedence); None when nothing serves it."""
        route = self.routes.get(name)
        if route is None and self.families:
            return self.family(name)
        return route

    def resolve(self, name: str) -> ModelRoute:
        """:meth:`get`, raising ModelNotFound (404, ``param: model``) for a name nothing
        serves."""
        route = self.get(name)
        if route is None:
            raise model_not_found(name)
        return route

    def family(self, name: str) -> ModelRoute | None:
        """The route of ``name`` by the first pattern that matches it, or None (exact names
        are not looked at: :meth:`get` does; an id holding a ``*`` is no id). Memoized, up
        to :data:`MEMO_ROUTES` ids."""
        memo = self._memo
        found = memo.get(name, _UNSEEN)  # (one lookup: a policy check may clear it)
        if found is not _UNSEEN:
            return found
        route = None
        for family in self.families if "*" not in name else ():  # "claude-*" is no id
            groups = family.pattern.match(name)
            if groups is not None:
                targets = tuple(Target(upstream, template.render(name, groups))
                                for upstream, template in family.targets)
                route = ModelRoute(name, targets, family.pattern.text, family.fixed)
                break
        if len(memo) >= MEMO_ROUTES:
            memo.clear()
        memo[name] = route
        return route

    def public(self) -> list[str]:
        """What GET /v1/models lists: the exact names and aliases, then each pattern
        entry's ``list`` (patterns themselves cannot be enumerated)."""
        return [*self.routes, *(i for ids in self.listed.values() for i in ids)]

    def metric_models(self) -> list[str]:
        """Every ``model`` metric label a request can get: the exact entries' targets'
        models, each pattern's fixed models and its name (:meth:`ModelRoute.metric_label`)."""
        out = [t.model for route in self.routes.values() for t in route.targets]
        for family in self.families:
            out += [*sorted(family.fixed), family.pattern.text]
        return list(dict.fromkeys(out))

    def known(self, extra: Iterable[str] = (), patterns: bool = True) -> Collection[str]:
        """The names a policy may give a model (rate limits, opt-ins...): the exact names
        and aliases, any id a pattern matches, ``extra`` (router aliases) and, when
        ``patterns``, the patterns as written (a tier's model must be one to serve: not)."""
        return _Known(self, frozenset(extra), patterns)


class _Known(Collection[str]):
    """:meth:`ModelTable.known`: iterates over the names it can list (not the ids)."""

    def __init__(self, table: ModelTable, extra: frozenset[str], patterns: bool) -> None:
        self._table, self._extra = table, extra
        self._patterns = {f.pattern.text for f in table.families} if patterns else set()
        self._names = [*table.routes, *self._patterns, *extra]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        table = self._table
        return (name in table.routes or name in self._extra or name in self._patterns
                or table.family(name) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
