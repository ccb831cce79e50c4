"""``[models."NAME"]``: the public models, exact names or families by pattern.

::

    [models."gpt-4o"]                      # an exact name (and its aliases)
    targets = [{ upstream = "openai", model = "gpt-4o" }]
    aliases = ["4o"]

    [models."claude-*"]                    # a family: every id it matches, passed through
    targets = [{ upstream = "anthropic" }]
    list = ["claude-sonnet-4-5", "claude-haiku-4-5"]   # what GET /v1/models shows of it

    [models."anthropic/*"]                 # a provider prefix, stripped
    targets = [{ upstream = "anthropic", model = "{1}" }]

Patterns and templates: :mod:`gateway.model_patterns`. Parsed by :mod:`gateway.config`
(``Config.models``), checked against the upstreams by :func:`check_models` at load.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gateway.errors import ConfigError
from gateway.model_patterns import ModelPattern, Template, by_precedence, is_pattern

__all__ = ["ModelConfig", "Target", "check_models"]


@dataclass(frozen=True)
class Target:
    """One place a model is served: an ``upstream`` and the ``model`` id it is sent as.

    Under an exact entry ``model`` is that id (required). Under a pattern entry it is a
    template (``{model}``: the id the client asked; ``{1}``...: what each ``*`` matched;
    e.g. ``"{1}"`` under ``anthropic/*``), and omitted it is ``{model}``: the id passes
    through. (Once resolved for a request, ``model`` is the id sent.)"""

    upstream: str
    model: str = ""


@dataclass(frozen=True)
class ModelConfig:
    """A public model name, or a pattern naming a family of them (a ``*`` in the name):
    ordered fallback ``targets``; an exact name's extra names (``aliases``); a pattern's ids
    for GET /v1/models to list (``list``: a pattern cannot be enumerated)."""

    targets: tuple[Target, ...]
    aliases: tuple[str, ...] = ()
    list: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("targets must name at least one upstream")


def check_models(models: Mapping[str, ModelConfig], upstreams: Collection[str],
                 path: str) -> None:
    """Raises ConfigError naming the file and key for: a target naming an unknown upstream;
    a bad pattern or template; an exact entry's target without a model, or with a template;
    a pattern with aliases, an exact entry with ``list``; a name or alias used twice; a
    listed id that this pattern entry would not serve (no match, or an exact name or a
    pattern before it takes it)."""
    names: dict[str, str] = {}
    patterns: dict[str, ModelPattern] = {}
    for name, model in models.items():
        key = f"models.{name}"
        pattern = _pattern(name, model, key, path)
        if pattern is not None:
            patterns[name] = pattern
        for i, target in enumerate(model.targets):
            if target.upstream not in upstreams:
                allowed = ", ".join(sorted(upstreams)) or "(none defined)"
                raise ConfigError(path, f"{key}.targets[{i}].upstream",
                                  f"unknown upstream {target.upstream!r}; defined upstreams: "
                                  f"{allowed}")
            _check_model(target.model, pattern, f"{key}.targets[{i}].model", path)
        for public in (name, *model.aliases):
            if public in names:
                raise ConfigError(path, key,
                                  f"name {public!r} already used by {names[public]!r}")
            names[public] = name
    order = by_precedence(list(patterns.values()))
    for name, pattern in patterns.items():
        for i, listed in enumerate(models[name].list):
            taken = names.get(listed) or next(
                (p.text for p in order if p.match(listed) is not None), None)
            if taken != name:
                why = ("it does not match the pattern" if taken is None else
                       f"it is served by {taken!r}, which comes first")
                raise ConfigError(path, f"models.{name}.list[{i}]",
                                  f"{listed!r} would not be served by this entry: {why}")


def _pattern(name: str, model: ModelConfig, key: str, path: str) -> ModelPattern | None:
    """The entry's pattern (None for an exact name), its keys checked."""
    if not is_pattern(name):
        if model.list:
            raise ConfigError(path, f"{key}.list", "only a pattern entry (a name with '*') "
                              "takes list: an exact name is listed by GET /v1/models")
        for alias in model.aliases:
            if is_pattern(alias):
                raise ConfigError(path, f"{key}.aliases", f"alias {alias!r}: an alias is "
                                  "an exact name ('*' makes a pattern an entry of its own)")
        return None
    try:
        pattern = ModelPattern(name)
    except ValueError as exc:
        raise ConfigError(path, key, str(exc)) from exc
    if model.aliases:
        raise ConfigError(path, f"{key}.aliases", "a pattern entry takes no aliases "
                          "(its list = [...] names ids GET /v1/models shows)")
    return pattern


def _check_model(model: str, pattern: ModelPattern | None, key: str, path: str) -> None:
    if pattern is None:
        if not model:
            raise ConfigError(path, key, "required key missing (a string): only a pattern "
                              "entry passes the client's id through")
        if "{" in model or "}" in model:
            raise ConfigError(path, key, f"{model!r}: templates ({{model}}, {{1}}) apply "
                              "under a pattern entry only")
        return
    try:
        Template(model or "{model}", pattern.stars)
    except ValueError as exc:
        raise ConfigError(path, key, str(exc)) from exc
