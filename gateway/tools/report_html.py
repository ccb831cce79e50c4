"""``gateway report``'s page: one self-contained HTML file from :func:`gateway.tools.report.
aggregate`'s numbers (inline CSS, inline SVG plots from :mod:`gateway.tools.report_svg`, no
request to any server), readable offline and attachable to a ticket.

A short inline script checks, once the page is laid out, that every plot drew (some mark
with a non-empty bounding box) and records it on ``<body>``: ``data-plots`` (plots on the
page) and ``data-plots-drawn`` (those that drew), so a headless browser can tell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from gateway.tools.report_svg import bars, legend, lines

__all__ = ["render"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1540px;padding:0 16px;
color:#1b1f24;background:#f6f7f9}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.source{color:#555;margin:0 0 16px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:8px}
.tile{background:#fff;border:1px solid #dde;border-radius:6px;padding:8px 10px}
.tile b{display:block;font-size:20px}.tile span{color:#555;font-size:12px}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(620px,1fr));gap:12px}
figure{background:#fff;border:1px solid #dde;border-radius:6px;margin:0;padding:10px 12px}
figcaption{font-weight:600;margin-bottom:4px}
.legend{font-size:12px;color:#444}.legend span{margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
svg.plot{width:100%;height:auto;display:block}
svg .grid{stroke:#e3e5e8}svg .axis,svg .value{font-size:11px;fill:#555}
.empty{color:#777;font-style:italic;margin:18px 0}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e3e5e8;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
"""

# Runs after the plots are parsed: getBBox() forces layout, so a mark that drew has a size.
_SCRIPT = """
(function () {
  var plots = document.querySelectorAll("svg.plot"), drawn = 0;
  plots.forEach(function (svg) {
    var ok = Array.prototype.some.call(svg.querySelectorAll(".mark"), function (m) {
      var box = m.getBBox(); return box.width > 0 || box.height > 0;
    });
    if (ok) { drawn++; svg.setAttribute("data-drawn", "1"); }
  });
  document.body.setAttribute("data-plots", String(plots.length));
  document.body.setAttribute("data-plots-drawn", String(drawn));
})();
"""


def _ms(x: float) -> str:
    return f"{x:,.0f} ms" if x >= 100 else f"{x:.3g} ms"


def _pct(x: float) -> str:
    return f"{x:.1%}".replace(".0%", "%")


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}"


def _count(x: float) -> str:
    return f"{x:,.0f}"


def _or_dash(value: Any, fmt: Callable[[Any], str]) -> str:
    return "–" if value is None else fmt(value)


def _figure(title: str, plot: str | None, names: Sequence[str] = (), empty: str = "") -> str:
    body = (legend(names) if len(names) > 1 else "") + plot if plot else \
        f'<p class="empty">{escape(empty)}</p>'
    return f"<figure><figcaption>{escape(title)}</figcaption>{body}</figure>"


def _timeline(report: dict[str, Any], title: str, names: Sequence[str],
              fields: Sequence[str], fmt: Callable[[float], str], empty: str) -> str:
    rows = report["timeline"]
    xs = [row["t"] for row in rows]
    series = [(name, [row[f] for row in rows]) for name, f in zip(names, fields)]
    if not any(v is not None for _, vs in series for v in vs):
        return _figure(title, None, empty=empty)
    return _figure(title, lines(title, xs, series, fmt, report["bucket_s"]), names)


def _counts(title: str, counts: dict[str, int], empty: str, total: int | None = None) -> str:
    if not any(counts.values()):
        return _figure(title, None, empty=empty)
    whole = total or sum(counts.values())

    def share(n: float) -> str:
        return f"{n:,.0f} ({n / whole:.0%})"

    return _figure(title, bars(title, [(k, [v]) for k, v in counts.items()], ["requests"],
                               share))


def _by(report: dict[str, Any], kind: str) -> str:
    rows = report[f"{kind}s"]
    title = "model" if kind == "model" else "key"
    tokens = [(r[kind], [r["prompt_tokens"] - r["cached_tokens"], r["cached_tokens"],
                         r["completion_tokens"]]) for r in rows]
    names = ["uncached input", "cached input", "output"]
    out = [_figure(f"Tokens by {title}", bars(f"tokens by {title}", tokens, names, _count)
                   if any(sum(v) for _, v in tokens) else None, names,
                   "No token counts in these logs.")]
    costs = [(r[kind], [r["cost_usd"], r["saved_usd"]]) for r in rows]
    names = ["estimated cost", "saved by the gateway's cache"]
    out.append(_figure(f"Estimated cost by {title} (USD)",
                       bars(f"cost by {title}", costs, names, _usd)
                       if any(sum(v) for _, v in costs) else None, names,
                       "Nothing priced: no tokens, or only unpriced and local models."))
    return "".join(out)


def _table(rows: list[dict[str, Any]], kind: str) -> str:
    head = ("requests", "errors", "cache hits", "input tokens", "cached share",
            "output tokens", "est. cost", "saved")
    cells = "".join(
        f"<tr><td>{escape(str(r[kind]))}</td><td>{r['requests']:,}</td>"
        f"<td>{r['errors']:,}</td><td>{r['cache_hits']:,}</td>"
        f"<td>{r['prompt_tokens']:,}</td><td>{_or_dash(r['cached_share'], _pct)}</td>"
        f"<td>{r['completion_tokens']:,}</td><td>{_usd(r['cost_usd'])}</td>"
        f"<td>{_usd(r['saved_usd'])}</td></tr>" for r in rows)
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"<table><tr><th>{kind}</th>{header}</tr>{cells}</table>"


def _tiles(report: dict[str, Any]) -> str:
    s, lat = report["summary"], report["latency_ms"]
    tiles = [
        ("requests", f"{s['requests']:,}"),
        ("errors", _or_dash(s["error_rate"], _pct)),
        ("shed", _or_dash(s["shed_rate"], _pct)),
        ("cancelled by the client", f"{s['cancelled']:,}"),
        ("latency p50 / p99", " / ".join(_or_dash(lat["total"][p], _ms) for p in ("p50", "p99"))),
        ("TTFT p50 / p99", " / ".join(_or_dash(lat["ttft"][p], _ms) for p in ("p50", "p99"))),
        ("overhead p50 / p99",
         " / ".join(_or_dash(lat["overhead"][p], _ms) for p in ("p50", "p99"))),
        ("cache hit rate", _or_dash(s["cache_hit_rate"], _pct)),
        ("cached input share", _or_dash(s["cached_input_share"], _pct)),
        ("estimated cost", _usd(s["cost_usd"])),
        ("saved by the cache", _usd(s["saved_usd"])),
    ]
    return '<div class="tiles">' + "".join(
        f'<div class="tile"><b>{escape(v)}</b><span>{escape(k)}</span></div>'
        for k, v in tiles) + "</div>"


def render(report: dict[str, Any]) -> str:
    """The page, as one HTML string, from :func:`gateway.tools.report.aggregate`'s dict."""
    src, s = report["source"], report["summary"]
    cache = {f"hit · {layer}": n for layer, n in report["cache_layers"].items()}
    cache |= {k: n for k, n in report["cache"].items() if k != "hit"}
    cache |= {"hit": report["cache"].get("hit", 0) - sum(report["cache_layers"].values())}
    compression = report["compression"]
    notes = []
    if report["unpriced_models"]:
        notes.append("Priced at 0 (no list price; pass --prices FILE): "
                     + ", ".join(report["unpriced_models"]) + ".")
    if compression["requests"]:
        notes.append(f"Compression: {compression['requests']:,} requests compressed, "
                     f"{compression['tokens_before']:,} to {compression['tokens_after']:,} "
                     f"tokens (mean ratio {compression['mean_ratio']}).")
    span = f"{src['first']} to {src['last']}" if src["first"] else "no timestamps"
    bucket = f"{report['bucket_s']} s buckets"
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        "<title>gateway report</title><style>", _CSS, "</style></head><body>",
        "<h1>Gateway report</h1>",
        (f'<p class="source">{escape(", ".join(src["files"]))}: {src["requests"]:,} '
         f"requests ({src['skipped']:,} other lines skipped), {escape(span)}; {bucket}.</p>"),
        _tiles(report),
        "<h2>Latency</h2><div class=\"grid2\">",
        _timeline(report, "Latency, arrival to last byte", ["p50", "p95", "p99"],
                  ["total_p50", "total_p95", "total_p99"], _ms, "No timed requests."),
        _timeline(report, "Time to first token (streams)", ["p50", "p95", "p99"],
                  ["ttft_p50", "ttft_p95", "ttft_p99"], _ms, "No streamed requests."),
        _timeline(report, "Gateway overhead (total − upstream)", ["p50", "p95", "p99"],
                  ["overhead_p50", "overhead_p95", "overhead_p99"], _ms, "No overhead times."),
        _timeline(report, f"Requests per bucket ({bucket})", ["requests", "errors", "shed"],
                  ["requests", "errors", "shed"], _count, "No timestamped requests."),
        "</div><h2>Cache, routing, shedding</h2><div class=\"grid2\">",
        _timeline(report, "Cache hit rate and cached input share",
                  ["gateway cache hits / lookups", "provider-cached input tokens / input"],
                  ["cache_hit_rate", "cached_share"], _pct,
                  "No cache lookups and no provider cache reads (cache off?)."),
        _counts("Gateway cache", {k: n for k, n in cache.items() if n},
                "No cache lookups (cache off).", s["requests"]),
        _counts("Route tiers", report["routes"], "No routed requests (routing off, or no "
                "`auto` model asked for)."),
        _counts("Shed or degraded, by reason", report["shed"], "Nothing shed.", s["requests"]),
        _counts("Status codes", report["status"], "No status codes."),
        _counts("Error types", report["error_types"], "No errors.", s["requests"]),
        "</div><h2>Tokens and estimated cost</h2><div class=\"grid2\">",
        _by(report, "model"), _by(report, "key"),
        "</div>", "".join(f"<p>{escape(n)}</p>" for n in notes),
        "<h2>By model</h2>", _table(report["models"], "model"),
        "<h2>By key</h2>", _table(report["keys"], "key"),
        "<script>", _SCRIPT, "</script></body></html>",
    ])
