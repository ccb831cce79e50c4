"""Lock-free histograms for the request path (see :mod:`gateway.metrics`): bucket counts
kept as plain lists, turned into a Prometheus histogram family at scrape time.

Bucket bounds are in seconds (Prometheus convention).
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client.core import HistogramMetricFamily, Metric

__all__ = ["LATENCY_BUCKETS", "OVERHEAD_BUCKETS", "Family", "Histogram"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.015, 0.025,
                    0.05, 0.1, 0.25, 1.0)


class Histogram:
    """Bucket counts for one label set: ``counts[i]`` holds observations in (b[i-1], b[i]]."""

    __slots__ = ("counts", "sum")

    def __init__(self, n_buckets: int):
        self.counts = [0] * (n_buckets + 1)  # the last one is +Inf
        self.sum = 0.0


class Family:
    """One histogram metric: label values -> :class:`Histogram`."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]):
        self.name, self.doc, self.labels, self.buckets = name, doc, labels, buckets
        self.series: dict[tuple[str, ...], Histogram] = {}

    def get(self, *values: str) -> Histogram:
        h = self.series.get(values)
        if h is None:
            h = self.series[values] = Histogram(len(self.buckets))
        return h

    def observe(self, h: Histogram, value: float) -> None:
        h.counts[bisect_left(self.buckets, value)] += 1
        h.sum += value

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        for values, h in self.series.items():
            cumulative, acc = [], 0
            for bound, count in zip((*map(str, self.buckets), "+Inf"), h.counts, strict=True):
                acc += count
                cumulative.append((bound, acc))
            family.add_metric(list(values), cumulative, h.sum)
        return family
