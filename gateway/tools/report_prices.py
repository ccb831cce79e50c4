"""List prices for ``gateway report``'s estimated cost: USD per million tokens, by model name.

A model is priced by the longest matching name prefix (``gpt-4o-mini-2024-07-18`` is
``gpt-4o-mini``, not ``gpt-4o``); a model matching none is priced 0 and listed as unpriced.
The table (:data:`PRICES`) is the providers' list prices for standard (not batch) requests,
as published on https://openai.com/api/pricing and
https://docs.anthropic.com/en/docs/about-claude/pricing (cache writes at the 5-minute TTL
price, 1.25x input); the local engine's models cost nothing. Prices change: ``--prices
FILE`` adds entries or replaces them, a TOML table per name prefix::

    ["gpt-4o"]
    input = 2.5        # USD per 1M uncached input tokens
    cached = 1.25      # per 1M input tokens read from the provider's prompt cache
    output = 10.0      # per 1M output tokens
    cache_write = 2.5  # optional: per 1M input tokens written to the cache (default: input)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gateway.errors import ConfigError

__all__ = ["PRICES", "Price", "load_prices", "price_of"]


@dataclass(frozen=True, slots=True)
class Price:
    """USD per 1M tokens: uncached input, cached input (read), output, cache writes (None:
    the input price)."""

    input: float
    cached: float
    output: float
    cache_write: float | None = None

    def cost(self, prompt: int, read: int, written: int, completion: int) -> float:
        """USD for ``prompt`` input tokens (all of them, ``read`` from the cache and
        ``written`` to it included) and ``completion`` output tokens."""
        write = self.input if self.cache_write is None else self.cache_write
        uncached = max(prompt - read - written, 0)
        return (uncached * self.input + read * self.cached + written * write
                + completion * self.output) / 1e6


def _claude(input_: float) -> Price:
    """Anthropic's shape: reads at 0.1x input, 5-minute writes at 1.25x, output 5x."""
    return Price(input_, input_ / 10, input_ * 5, input_ * 1.25)


PRICES: Mapping[str, Price] = MappingProxyType({
    "gpt-4o": Price(2.5, 1.25, 10.0),
    "gpt-4o-mini": Price(0.15, 0.075, 0.6),
    "gpt-4.1": Price(2.0, 0.5, 8.0),
    "gpt-4.1-mini": Price(0.4, 0.1, 1.6),
    "gpt-4.1-nano": Price(0.1, 0.025, 0.4),
    "gpt-5": Price(1.25, 0.125, 10.0),
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.4),
    "o1": Price(15.0, 7.5, 60.0),
    "o3": Price(2.0, 0.5, 8.0),
    "o4-mini": Price(1.1, 0.275, 4.4),
    "text-embedding-3-small": Price(0.02, 0.02, 0.0),
    "text-embedding-3-large": Price(0.13, 0.13, 0.0),
    "claude-opus-4-5": _claude(5.0),
    "claude-opus-4": _claude(15.0),
    "claude-sonnet-4": _claude(3.0),
    "claude-3-7-sonnet": _claude(3.0),
    "claude-3-5-sonnet": _claude(3.0),
    "claude-haiku-4-5": _claude(1.0),
    "claude-3-5-haiku": _claude(0.8),
    # The co-located engine's models.
    "smollm2": Price(0.0, 0.0, 0.0),
    "all-MiniLM-L6-v2": Price(0.0, 0.0, 0.0),
})

_FIELDS = ("input", "cached", "output", "cache_write")


def price_of(model: str, prices: Mapping[str, Price]) -> Price | None:
    """The price of the longest name prefix of ``model`` in ``prices``, or None."""
    best = max((name for name in prices if model.startswith(name)), key=len, default=None)
    return None if best is None else prices[best]


def load_prices(path: Path, base: Mapping[str, Price] = PRICES) -> dict[str, Price]:
    """``base`` with the entries of the TOML file at ``path`` added or replaced.

    Raises ConfigError (naming the file and the key) for a file that is not TOML, an entry
    that is not a table, a missing price, a price that is not a number >= 0 or an unknown key.
    """
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(str(path), "", str(exc)) from exc
    out = dict(base)
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise ConfigError(str(path), name, "expected a table of prices (USD per 1M tokens)")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise ConfigError(str(path), f"{name}.{unknown[0]}",
                              f"unknown key; allowed: {', '.join(_FIELDS)}")
        values: dict[str, float] = {}
        for key, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(str(path), f"{name}.{key}",
                                  "expected a number >= 0 (USD per 1M tokens)")
            values[key] = float(value)
        missing = [key for key in _FIELDS[:3] if key not in values]
        if missing:
            raise ConfigError(str(path), f"{name}.{missing[0]}", "missing")
        out[name] = Price(**values)
    return out
