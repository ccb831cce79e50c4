"""One scrape target: the local engines' Prometheus metrics, served on the gateway's own
``/metrics``.

Each ``type = "local"`` upstream runs its engine as a child process with its own registry
(``engine_*``: queue, KV blocks, TTFT, step times; :mod:`local_engine.metrics`). At scrape
time the gateway reads each running engine's ``/metrics`` over loopback (bounded by
``timeout_s``), adds an ``upstream`` label naming the upstream, and appends the families to
its own exposition. An engine that is down or slow is left out of that scrape and counted in
``gateway_engine_scrape_errors_total{upstream}``; the gateway's own metrics are always
served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator

import aiohttp
from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["EngineScraper", "ScrapeErrors"]


class _Families:
    """A registry-like object over parsed families, for ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class EngineScraper:
    """``engines``: upstream name -> its engine's metrics URL."""

    def __init__(self, engines: dict[str, str], timeout_s: float = 1.0) -> None:
        self.engines = engines
        self.timeout_s = timeout_s
        self.errors: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None

    async def render(self, names: Iterable[str]) -> bytes:
        """The named engines' metrics in the text exposition format, labelled by upstream
        (b"" when none answered)."""
        urls = [(name, self.engines[name]) for name in names if name in self.engines]
        if not urls:
            return b""
        texts = await asyncio.gather(*(self._fetch(name, url) for name, url in urls))
        families: list[Metric] = []
        for (name, _), text in zip(urls, texts, strict=True):
            if text is not None:
                families += _labelled(text, name)
        return generate_latest(_Families(families)) if families else b""

    async def _fetch(self, name: str, url: str) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.get(url) as response:
                if response.status == 200:
                    return await response.text()
        except (aiohttp.ClientError, TimeoutError):
            pass
        self.errors[name] = self.errors.get(name, 0) + 1
        return None

    def collector(self) -> ScrapeErrors:
        """Its failed scrapes, for the gateway's registry."""
        return ScrapeErrors(self)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class ScrapeErrors(Collector):
    def __init__(self, scraper: EngineScraper) -> None:
        self.scraper = scraper

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("gateway_engine_scrape_errors",
                                     "Engine /metrics reads that failed or timed out.",
                                     labels=["upstream"])
        for name in self.scraper.engines:
            family.add_metric([name], self.scraper.errors.get(name, 0))
        yield family


def _labelled(text: str, upstream: str) -> list[Metric]:
    out = []
    for family in text_string_to_metric_families(text):
        metric = Metric(family.name, family.documentation, family.type, family.unit)
        metric.samples = [Sample(s.name, {**s.labels, "upstream": upstream}, s.value,
                                 s.timestamp, s.exemplar) for s in family.samples]
        out.append(metric)
    return out
