"""Strict TOML -> frozen dataclass conversion, shared by the config and the policy files.

A schema is a frozen dataclass whose field annotations say what a key may hold: ``int``,
``float``, ``str``, ``bool``, ``Literal[...]``, ``X | None``, ``tuple[X, ...]``,
``dict[str, X]`` and nested dataclasses. Unknown keys, wrong types and values outside a
field's bounds raise :class:`~gateway.errors.ConfigError` naming the file, the dotted key and
what is allowed. Bounds go in field metadata: ``bounded(default, ge=0, le=1)``.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from gateway.errors import ConfigError

__all__ = ["bounded", "load_toml", "parse"]

T = TypeVar("T")


def bounded(default: Any, *, ge: float | None = None, le: float | None = None) -> Any:
    """A dataclass field with a default and inclusive numeric bounds checked at parse time."""
    return dataclasses.field(default=default, metadata={"ge": ge, "le": le})


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; raises ConfigError (with the file name) when missing or malformed."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError as exc:
        raise ConfigError(str(path), "", "file not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "", f"invalid TOML: {exc}") from exc


def parse(cls: type[T], data: Any, path: str, key: str = "") -> T:
    """Convert ``data`` (parsed TOML) into the frozen dataclass ``cls``, strictly."""
    return typing.cast(T, _convert(cls, data, path, key))


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return f"a table of {_describe(get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    if tp is type(None):
        return "absent"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _convert(tp: Any, value: Any, path: str, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(tp, value, path, key)
    if origin is Literal:
        if value in get_args(tp):
            return value
    elif origin in (Union, types.UnionType):
        inner: ConfigError | None = None  # a failure inside the value names the bad key
        for arg in get_args(tp):
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path, key)
            except ConfigError as exc:
                if inner is None and exc.key != key:
                    inner = exc
        if inner is not None:
            raise inner
    elif origin is tuple:
        if isinstance(value, list):
            item = get_args(tp)[0]
            return tuple(_convert(item, v, path, f"{key}[{i}]") for i, v in enumerate(value))
    elif origin is dict:
        if isinstance(value, dict):
            item = get_args(tp)[1]
            return {k: _convert(item, v, path, f"{key}.{k}") for k, v in value.items()}
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(path, key, f"expected {_describe(tp)}, got {value!r}")


def _convert_dataclass(cls: type, value: Any, path: str, key: str) -> Any:
    if not isinstance(value, dict):
        raise ConfigError(path, key, f"expected a table, got {value!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields))
        raise ConfigError(path, _join(key, unknown[0]), f"unknown key; allowed keys: {allowed}")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        sub = _join(key, name)
        if name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(path, sub, f"required key missing ({_describe(hints[name])})")
            continue
        converted = _convert(hints[name], value[name], path, sub)
        _check_bounds(field, converted, path, sub)
        kwargs[name] = converted
    try:
        return cls(**kwargs)
    except ValueError as exc:  # __post_init__ cross-field checks
        raise ConfigError(path, key, str(exc)) from exc


def _check_bounds(field: dataclasses.Field[Any], value: Any, path: str, key: str) -> None:
    ge, le = field.metadata.get("ge"), field.metadata.get("le")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if ge is not None and value < ge:
            raise ConfigError(path, key, f"must be >= {ge}, got {value!r}")
        if le is not None and value > le:
            raise ConfigError(path, key, f"must be <= {le}, got {value!r}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
