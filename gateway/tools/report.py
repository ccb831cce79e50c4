"""``gateway report LOG...``: a dashboard page from the request log, with no service to run.

    gateway report LOG... [--out FILE.html] [--json] [--prices FILE]

Reads the gateway's JSON request lines (``"event": "request"``, :mod:`gateway.requestlog`)
from each LOG with DuckDB's JSON reader (``.gz`` files too); every other line (the
gateway's other events, uvicorn's, anything malformed) is skipped and counted. A field that
is absent, null or of the wrong type counts as missing, so logs of a gateway with no cache
or no routing give empty sections, not errors. A client that went away (499) is counted as
cancelled, not as an error. ``--out`` writes one self-contained HTML page
(inline SVG plots, no network: :mod:`gateway.tools.report_html`); ``--json`` prints the
aggregates (:func:`aggregate`). Percentiles interpolate linearly (DuckDB ``quantile_cont``).

Estimated cost (USD) is list price (:mod:`gateway.tools.report_prices`) times the tokens the
upstreams reported; a response served from the gateway's own cache cost nothing and its
tokens count as ``saved_usd``. The cached input share is the provider prompt-cache reads
over the input tokens of requests that reached an upstream.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.tools.report_prices import PRICES, Price, load_prices, price_of

__all__ = ["COLUMNS", "add_arguments", "aggregate", "bucket_seconds"]

#: The log fields the report reads, with their DuckDB types (others are ignored).
COLUMNS: Mapping[str, str] = {
    "event": "VARCHAR", "request_id": "VARCHAR", "ts": "VARCHAR", "key_id": "VARCHAR",
    "model_requested": "VARCHAR", "model_served": "VARCHAR", "status": "INTEGER",
    "stream": "BOOLEAN", "cancelled": "BOOLEAN", "ttft_ms": "DOUBLE", "queue_ms": "DOUBLE",
    "total_ms": "DOUBLE", "upstream_ms": "DOUBLE", "overhead_ms": "DOUBLE",
    "prompt_tokens": "BIGINT", "completion_tokens": "BIGINT", "cached_tokens": "BIGINT",
    "cache_read_tokens": "BIGINT", "cache_write_tokens": "BIGINT", "error_type": "VARCHAR",
    "shed": "VARCHAR", "cache": "VARCHAR", "cache_layer": "VARCHAR", "router": "VARCHAR",
    "route_tier": "VARCHAR", "route_fallback": "VARCHAR", "compression": "DOUBLE",
    "tokens_before": "BIGINT", "tokens_after": "BIGINT", "compress_skip": "VARCHAR",
}

#: Bucket widths (s) for the time series: the smallest giving at most MAX_BUCKETS buckets.
BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
             43200, 86400)
MAX_BUCKETS = 60
PERCENTILES = (0.5, 0.9, 0.95, 0.99)

_LINES = """
CREATE TEMP TABLE lines AS
SELECT * FROM read_json($files, format = 'newline_delimited', ignore_errors = true,
                        columns = $columns)
"""

_REQUESTS = """
CREATE TEMP TABLE r AS
SELECT *, epoch(try_cast(ts AS TIMESTAMPTZ)) AS t,
       (status >= 400 AND status <> 499) OR error_type IS NOT NULL AS failed,
       coalesce(cache = 'hit', false) AS hit,
       coalesce(cache_read_tokens, cached_tokens) AS read_tokens
FROM lines WHERE coalesce(event, 'request') = 'request' AND request_id IS NOT NULL
"""

_TIMELINE = """
SELECT floor(t / $bucket) * $bucket AS t, count(*) AS requests,
       count(*) FILTER (failed) AS errors, count(shed) AS shed,
       count(cache) AS cache_lookups, count(*) FILTER (hit) AS cache_hits,
       quantile_cont(total_ms, [0.5, 0.95, 0.99]) AS total_ms,
       quantile_cont(ttft_ms, [0.5, 0.95, 0.99]) AS ttft_ms,
       quantile_cont(overhead_ms, [0.5, 0.95, 0.99]) AS overhead_ms,
       sum(prompt_tokens) FILTER (NOT hit) AS input_tokens,
       sum(read_tokens) FILTER (NOT hit) AS cached_tokens
FROM r WHERE t IS NOT NULL GROUP BY 1 ORDER BY 1
"""

_USAGE = """
SELECT coalesce(model_served, model_requested, '(none)') AS model,
       coalesce(key_id, '(no key)') AS key, hit, count(*) AS requests,
       count(*) FILTER (failed) AS errors, coalesce(sum(prompt_tokens), 0) AS prompt,
       coalesce(sum(read_tokens), 0) AS read, coalesce(sum(cache_write_tokens), 0) AS written,
       coalesce(sum(completion_tokens), 0) AS completion
FROM r GROUP BY ALL ORDER BY ALL
"""


def bucket_seconds(span_s: float) -> int:
    """The time-series bucket width (s) for a log spanning ``span_s`` seconds."""
    return next((b for b in BUCKETS_S if span_s / b < MAX_BUCKETS), BUCKETS_S[-1])


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole else None


def aggregate(paths: Sequence[Path], prices: Mapping[str, Price] = PRICES) -> dict[str, Any]:
    """The report's numbers from the request lines of the logs at ``paths``, JSON-ready.

    Keys: ``source`` (files, lines read, requests, lines skipped, first and last ``ts``),
    ``summary`` (counts and rates), ``latency_ms`` (p50/p90/p95/p99/max of total, TTFT,
    overhead, queue and upstream time), ``bucket_s`` and ``timeline`` (one row per bucket:
    requests, errors, sheds, cache hits, p50/p95/p99 of total, TTFT and overhead in ms,
    input and cached tokens), ``status``, ``error_types``, ``cache``, ``cache_layers``,
    ``routes``, ``route_fallbacks``, ``shed``, ``compression``, ``models`` and ``keys``
    (requests, errors, tokens, ``cost_usd``, ``saved_usd``, ``cached_share``), and
    ``unpriced_models``. Times in ms, costs in USD, shares as fractions (null when the
    whole is 0).
    """
    import duckdb  # only this command needs it

    con = duckdb.connect()
    con.execute(_LINES, {"files": [str(p) for p in paths], "columns": dict(COLUMNS)})
    con.execute(_REQUESTS)

    def rows(sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return con.execute(sql, params or {}).fetchall()

    def counts(expr: str, where: str = "true") -> dict[str, int]:
        return {str(k): n for k, n in rows(
            f"SELECT {expr}, count(*) FROM r WHERE {where} AND {expr} IS NOT NULL "
            "GROUP BY 1 ORDER BY 2 DESC, 1")}

    lines, = rows("SELECT count(*) FROM lines")[0]
    n, first, last, failed, shed, streams, cancelled, lookups, hits = rows(
        "SELECT count(*), min(t), max(t), count(*) FILTER (failed), count(shed),"
        " count(*) FILTER (stream), count(*) FILTER (cancelled), count(cache),"
        " count(*) FILTER (hit) FROM r")[0]
    quantiles = ", ".join(
        f"quantile_cont({c}, {list(PERCENTILES)}), max({c})"
        for c in ("total_ms", "ttft_ms", "overhead_ms", "queue_ms", "upstream_ms"))
    stats = rows(f"SELECT {quantiles} FROM r")[0]
    latency = {}
    for i, name in enumerate(("total", "ttft", "overhead", "queue", "upstream")):
        values, top = stats[2 * i] or [None] * len(PERCENTILES), stats[2 * i + 1]
        latency[name] = {**{f"p{round(p * 100)}": _round(v) for p, v in zip(PERCENTILES, values)},
                         "max": _round(top)}
    bucket = bucket_seconds((last - first) if n and first is not None else 0.0)
    timeline = [_timeline_row(row) for row in rows(_TIMELINE, {"bucket": bucket})]
    models, keys, unpriced, totals = _usage(rows(_USAGE), prices)
    compressed, before, after, ratio = rows(
        "SELECT count(compression), sum(tokens_before) FILTER (compression IS NOT NULL),"
        " sum(tokens_after) FILTER (compression IS NOT NULL), avg(compression) FROM r")[0]
    return {
        "source": {"files": [str(p) for p in paths], "lines": lines, "requests": n,
                   "skipped": lines - n, "first": _iso(first), "last": _iso(last)},
        "summary": {
            "requests": n, "errors": failed, "error_rate": _share(failed, n),
            "shed": shed, "shed_rate": _share(shed, n), "streams": streams,
            "cancelled": cancelled, "cache_lookups": lookups, "cache_hits": hits,
            "cache_hit_rate": _share(hits, lookups), **totals},
        "latency_ms": latency,
        "bucket_s": bucket,
        "timeline": timeline,
        "status": counts("status"),
        "error_types": counts("error_type"),
        "cache": counts("cache"),
        "cache_layers": counts("cache_layer", "hit"),
        "routes": counts("route_tier"),
        "route_fallbacks": counts("route_fallback"),
        "shed": counts("shed"),
        "compression": {"requests": compressed, "tokens_before": before or 0,
                        "tokens_after": after or 0, "mean_ratio": _round(ratio),
                        "skipped": counts("compress_skip")},
        "models": models,
        "keys": keys,
        "unpriced_models": unpriced,
    }


def _timeline_row(row: tuple[Any, ...]) -> dict[str, Any]:
    t, requests, errors, shed, lookups, hits, total, ttft, overhead, inp, cached = row
    out: dict[str, Any] = {"t": t, "ts": _iso(t), "requests": requests, "errors": errors,
                           "shed": shed, "cache_lookups": lookups, "cache_hits": hits,
                           "cache_hit_rate": _share(hits, lookups),
                           "input_tokens": inp or 0, "cached_tokens": cached or 0,
                           "cached_share": _share(cached or 0, inp or 0)}
    for name, values in (("total", total), ("ttft", ttft), ("overhead", overhead)):
        for p, v in zip((50, 95, 99), values or (None, None, None)):
            out[f"{name}_p{p}"] = _round(v)
    return out


_TOKENS = ("requests", "errors", "cache_hits", "prompt_tokens", "cached_tokens",
           "cache_write_tokens", "completion_tokens")


def _usage(groups: list[tuple[Any, ...]], prices: Mapping[str, Price]) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]], list[str], dict[str, Any]]:
    """Rows by model and by key (most expensive, then busiest, first), the unpriced models,
    and the totals, from (model, key, cache hit, counts...) groups."""
    by: dict[str, dict[str, dict[str, Any]]] = {"model": {}, "key": {}}
    total = dict.fromkeys((*_TOKENS, "cost_usd", "saved_usd"), 0.0)
    unpriced: set[str] = set()
    for model, key, hit, requests, errors, prompt, read, written, completion in groups:
        price = price_of(model, prices)
        if price is None and (prompt or completion):
            unpriced.add(model)
        cost = price.cost(prompt, read, written, completion) if price else 0.0
        add = dict(zip(_TOKENS, (requests, errors, requests if hit else 0, 0 if hit else prompt,
                                 0 if hit else read, 0 if hit else written,
                                 0 if hit else completion)))
        add["cost_usd"], add["saved_usd"] = (0.0, cost) if hit else (cost, 0.0)
        for kind, name in (("model", model), ("key", key)):
            row = by[kind].setdefault(name, {kind: name, **dict.fromkeys(total, 0)})
            for field, value in add.items():
                row[field] += value
        for field, value in add.items():
            total[field] += value

    def finish(row: dict[str, Any]) -> dict[str, Any]:
        row["cost_usd"], row["saved_usd"] = round(row["cost_usd"], 6), round(row["saved_usd"], 6)
        row["cached_share"] = _share(row["cached_tokens"], row["prompt_tokens"])
        return row

    def ordered(kind: str) -> list[dict[str, Any]]:
        return sorted((finish(r) for r in by[kind].values()),
                      key=lambda r: (-r["cost_usd"], -r["requests"], r[kind]))

    finish(total)
    totals = {"prompt_tokens": int(total["prompt_tokens"]),
              "cached_tokens": int(total["cached_tokens"]),
              "completion_tokens": int(total["completion_tokens"]),
              "cached_input_share": total["cached_share"], "cost_usd": total["cost_usd"],
              "saved_usd": total["saved_usd"]}
    return ordered("model"), ordered("key"), sorted(unpriced), totals


def _run(args: argparse.Namespace) -> int:
    if args.out is None and not args.json:
        print("error: nothing to do: give --out FILE.html, --json or both", file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.log]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"error: no such log file: {', '.join(missing)}", file=sys.stderr)
        return 2
    prices = PRICES if args.prices is None else load_prices(Path(args.prices))
    report = aggregate(paths, prices)
    if args.out is not None:
        from gateway.tools.report_html import render

        Path(args.out).write_text(render(report), encoding="utf-8")
        source = report["source"]
        print(f"wrote {args.out}: {source['requests']} requests ({source['skipped']} other "
              f"lines skipped)", file=sys.stderr)
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``gateway report`` parser."""
    parser.add_argument("log", nargs="+", help="the gateway's stdout: JSON request lines, "
                        "other lines skipped (.gz read as such)")
    parser.add_argument("--out", metavar="FILE.html", help="write the dashboard page here")
    parser.add_argument("--json", action="store_true", help="print the aggregates as JSON")
    parser.add_argument("--prices", metavar="FILE", help="TOML of USD per 1M tokens by "
                        "model-name prefix, added to or replacing the built-in list prices")
    parser.set_defaults(func=_run)
