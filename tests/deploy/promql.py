"""What deploy/'s dashboard and alert rules query, and what a /metrics page exports.

``metric_names`` takes the metric names out of a PromQL expression without a PromQL parser:
strings, label matchers, range and subquery brackets and grouping clauses are dropped, and
what is left that looks like an identifier, is not followed by ``(`` (a function) and is not
a keyword or a number's exponent is a metric name. ``selectors`` adds each name's label
matchers, and ``selects`` says whether a series' labels satisfy them. promtool checks the
syntax itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Matcher", "dashboard_exprs", "exported_names", "metric_names", "rule_exprs",
           "selectors", "selects"]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "llm-gateway.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

#: One label matcher: (label, operator: = != =~ !~, value).
Matcher: TypeAlias = tuple[str, str, str]

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "offset", "bool", "inf", "nan"}
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
#: Labels Prometheus attaches to every scraped series (the dashboard selects ``instance``).
_TARGET_LABELS = {"instance", "job"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "summary": ("_sum", "_count"), "gauge": ("",), "unknown": ("",), "info": ("_info",)}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, e.g. ``{"gateway_requests_total"}`` for
    ``sum by (model) (rate(gateway_requests_total{status="200"}[5m]))``."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ",
                  text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end():].lstrip().startswith("("):
            continue
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def selectors(expr: str) -> list[tuple[str, tuple[Matcher, ...]]]:
    """(metric name, its label matchers) for each vector selector of a PromQL expression,
    e.g. ``[("x_total", (("result", "=", "hit"),))]`` for ``rate(x_total{result="hit"}[5m])``.
    """
    names = metric_names(expr)
    found = []
    for match in re.finditer(r'(?<![\w.$"])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?', expr):
        if match.group(1) in names:
            found.append((match.group(1), tuple(_MATCHER.findall(match.group(2) or ""))))
    return found


def selects(matchers: tuple[Matcher, ...], labels: dict[str, str]) -> bool:
    """Whether a series with ``labels`` satisfies ``matchers`` as Prometheus reads them (a
    missing label is the empty string; regular expressions match the whole value). The
    target labels Prometheus adds at scrape time (``instance``, ``job``) match anything."""
    for label, op, value in matchers:
        if label in _TARGET_LABELS:
            continue
        have = labels.get(label, "")
        if op in ("=~", "!~"):
            ok = re.fullmatch(value, have) is not None
        else:
            ok = have == value
        if ok != (op in ("=", "=~")):
            return False
    return True


def dashboard_exprs(path: Path = DASHBOARD) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable of a Grafana dashboard;
    ``label_values(METRIC, label)`` variables yield ``METRIC``."""
    dashboard = json.loads(path.read_text())

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            yield f"variable {var['name']!r}", found.group(1) if found else query


def rule_exprs(path: Path = ALERTS) -> Iterator[tuple[str, str]]:
    """(rule name, PromQL) for every rule of a Prometheus rules file."""
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def exported_names(text: str) -> tuple[set[str], set[str]]:
    """(names with at least one sample, names of families declared without samples) on a
    Prometheus text exposition page; a histogram ``x`` stands for ``x_bucket``, ``x_sum``
    and ``x_count``, a counter ``x`` for ``x_total``."""
    sampled: set[str] = set()
    declared: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.samples:
            sampled.update(s.name for s in family.samples)
        else:
            declared.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return sampled, declared - sampled
