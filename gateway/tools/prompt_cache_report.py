"""``gateway prompt-cache report LOG``: what the providers' prompt caches did, from the request log.

    gateway prompt-cache report LOG [--json] [--read-multiplier X] [--write-multiplier Y]

Reads the gateway's JSON request lines (``"event": "request"``; other lines are skipped; LOG
``-`` is stdin) and prints, per served model and in all, over the requests whose upstream
reported usage: requests, input tokens (``prompt_tokens``: all input, cached included), the
cached share (``cache_read_tokens / prompt_tokens``), tokens written to the cache
(``cache_write_tokens``; Anthropic reports them, OpenAI does not), and the input cost against
no caching::

    (uncached + read x read_multiplier + written x write_multiplier) / input tokens

Multipliers by model-name prefix (:data:`MULTIPLIERS`; a model matching none is counted at
1.0, no savings claimed), from the providers' pricing pages: Anthropic reads 0.1x, writes
1.25x for the 5-minute TTL (2x for 1 hour: the log does not say which, so pass
``--write-multiplier 2`` for 1-hour caching); OpenAI cached input 0.5x (gpt-4o, o1), 0.25x
(gpt-4.1, o3, o4-mini), 0.1x (gpt-5), and writes cost nothing extra. ``--read-multiplier`` and
``--write-multiplier`` override them for every model.
Sources: https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching#pricing,
https://platform.openai.com/docs/pricing
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = ["MULTIPLIERS", "ModelReport", "add_arguments", "multipliers", "read_log", "summarize"]

#: (model-name prefix, cached-read multiplier, cache-write multiplier) of the input price;
#: the first matching prefix wins.
MULTIPLIERS: tuple[tuple[str, float, float], ...] = (
    ("claude", 0.1, 1.25),
    ("gpt-5", 0.1, 1.0), ("gpt-4.1", 0.25, 1.0), ("o3", 0.25, 1.0), ("o4-mini", 0.25, 1.0),
    ("gpt-4o", 0.5, 1.0), ("o1", 0.5, 1.0),
)


def multipliers(model: str) -> tuple[float, float]:
    """(read, write) input-price multipliers of ``model`` (MULTIPLIERS; else 1.0, 1.0)."""
    return next(((r, w) for prefix, r, w in MULTIPLIERS if model.startswith(prefix)), (1.0, 1.0))


@dataclass
class ModelReport:
    """Totals of one model's requests, in tokens; ``input_cost`` in uncached-token
    equivalents. Multipliers None: mixed (the "all" row of several models)."""

    model: str
    read_multiplier: float | None
    write_multiplier: float | None
    requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    input_cost: float = 0.0

    def add(self, prompt: int, read: int, written: int, read_x: float, write_x: float) -> None:
        """One request (or a model's totals): its input, cached and written tokens and the
        multipliers they are priced at."""
        self.requests += 1
        self.prompt_tokens += prompt
        self.cache_read_tokens += read
        self.cache_write_tokens += written
        self.input_cost += prompt - read - written + read * read_x + written * write_x

    def as_dict(self) -> dict[str, Any]:
        """The totals plus ``cached_share`` and ``relative_cost`` (input cost over the cost
        without caching), both fractions, null without input tokens."""
        total = self.prompt_tokens
        return {**self.__dict__, "input_cost": round(self.input_cost, 1),
                "cached_share": round(self.cache_read_tokens / total, 4) if total else None,
                "relative_cost": round(self.input_cost / total, 4) if total else None}


def read_log(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The request records among log lines: JSON objects with ``event`` "request" (or none)
    and an integer ``prompt_tokens``; anything else is skipped."""
    for line in lines:
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if (isinstance(record, dict) and record.get("event", "request") == "request"
                and isinstance(record.get("prompt_tokens"), int)):
            yield record


def summarize(records: Iterable[dict[str, Any]], read: float | None = None,
              write: float | None = None) -> dict[str, ModelReport]:
    """Per served model (``model_served``, else ``model_requested``), then ``"all"``;
    ``read``/``write`` override every model's multipliers."""
    out: dict[str, ModelReport] = {}
    prices: dict[str, tuple[float, float]] = {}
    total = ModelReport("all", read, write)
    for record in records:
        model = str(record.get("model_served") or record.get("model_requested") or "unknown")
        if model not in out:
            r, w = multipliers(model)
            prices[model] = (r if read is None else read, w if write is None else write)
            out[model] = ModelReport(model, *prices[model])
        counts = (record["prompt_tokens"], record.get("cache_read_tokens") or 0,
                  record.get("cache_write_tokens") or 0)
        out[model].add(*counts, *prices[model])
        total.add(*counts, *prices[model])
    if len(set(prices.values())) == 1:
        total.read_multiplier, total.write_multiplier = next(iter(prices.values()))
    out["all"] = total
    return out


def _report(args: argparse.Namespace) -> int:
    if args.log == "-":
        lines: Iterable[bytes] = sys.stdin.buffer
    else:
        path = Path(args.log)
        if not path.is_file():
            print(f"error: no such log file: {path}", file=sys.stderr)
            return 2
        lines = path.read_bytes().splitlines()
    reports = summarize(read_log(lines), args.read_multiplier, args.write_multiplier)
    if args.json:
        print(orjson.dumps({k: v.as_dict() for k, v in reports.items()},
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{'model':<28} {'requests':>8} {'input tokens':>13} {'cached':>7} "
          f"{'written':>11} {'input cost':>10}  multipliers (read, write)")
    for report in reports.values():
        row = report.as_dict()
        share = "-" if row["cached_share"] is None else f"{row['cached_share']:.1%}"
        cost = "-" if row["relative_cost"] is None else f"{row['relative_cost']:.1%}"
        print(f"{report.model:<28} {report.requests:>8} {report.prompt_tokens:>13,} "
              f"{share:>7} {report.cache_write_tokens:>11,} {cost:>10}  "
              f"{_times(report.read_multiplier)}, {_times(report.write_multiplier)}")
    return 0


def _times(multiplier: float | None) -> str:
    return "mixed" if multiplier is None else f"{multiplier:g}x"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``gateway prompt-cache`` parser: its report action."""
    actions = parser.add_subparsers(dest="prompt_cache_command", required=True)
    report = actions.add_parser("report", help="cached share of input tokens, cache writes "
                                "and estimated input-cost savings by model")
    report.add_argument("log", help="the gateway's JSON request log (one line a request); "
                        "- for stdin")
    report.add_argument("--json", action="store_true", help="print JSON instead of a table")
    report.add_argument("--read-multiplier", type=float,
                        help="price of a cached input token over an uncached one, all models")
    report.add_argument("--write-multiplier", type=float,
                        help="price of a token written to the cache over an uncached one")
    report.set_defaults(func=_report)
