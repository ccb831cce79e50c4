"""Prometheus series of the replica pools, read at scrape time (nothing per request):

- ``gateway_replica_up{upstream,replica}``: 1 while the replica takes requests, 0 ejected
- ``gateway_replica_in_flight``: this gateway's requests on it now
- ``gateway_replica_reported_load``: running plus waiting sequences it last reported
- ``gateway_replica_prefix_blocks``: blocks its prefix index holds (``prefix``: the
  gateway's estimate; ``prefix_precise``: what the engine reported)
- ``gateway_replica_ejections_total``: times it was ejected (outlier detection)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.replicas.pool import ReplicaPool
from gateway.replicas.watch import Member

__all__ = ["PoolCollector"]


class PoolCollector(Collector):
    def __init__(self, pools: Iterable[ReplicaPool]) -> None:
        self._pools = list(pools)

    def collect(self) -> Iterator[Metric]:
        def blocks(pool: ReplicaPool, m: Member) -> float:
            return len(m.state.held if pool.router.keys == "tokens" else m.state.sent)

        gauges: dict[str, tuple[str, Callable[[ReplicaPool, Member], float]]] = {
            "gateway_replica_up": ("1: the replica takes requests; 0: ejected.",
                                   lambda p, m: float(m.outlier.available(p.clock()))),
            "gateway_replica_in_flight": ("This gateway's requests on the replica.",
                                          lambda p, m: m.state.in_flight),
            "gateway_replica_reported_load": ("Running and waiting sequences it reported.",
                                              lambda p, m: m.state.reported),
            "gateway_replica_prefix_blocks": ("Blocks the replica's prefix index holds.",
                                              blocks),
        }
        labels = ["upstream", "replica"]
        for name, (doc, read) in gauges.items():
            family = GaugeMetricFamily(name, doc, labels=labels)
            for pool in self._pools:
                for member in list(pool.members.values()):
                    family.add_metric([pool.name, member.url], read(pool, member))
            yield family
        ejections = CounterMetricFamily("gateway_replica_ejections",
                                        "Times the replica was ejected.", labels=labels)
        for pool in self._pools:
            for member in list(pool.members.values()):
                ejections.add_metric([pool.name, member.url], member.outlier.ejected_total)
        yield ejections
