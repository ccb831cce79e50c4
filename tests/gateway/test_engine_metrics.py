"""The engine's metrics on the gateway's /metrics: labelled by upstream; an engine that does
not answer is left out and counted, never an error for the scrape."""

from __future__ import annotations

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from gateway.engine_metrics import EngineScraper
from gateway.testing.server import ServerThread
from gateway.upstreams.ports import free_port
from local_engine.metrics import EngineMetrics


async def test_engine_families_are_relabelled_and_a_dead_engine_is_counted():
    engine = EngineMetrics(None)
    engine.generated.inc(7)

    async def metrics(request):
        return Response(generate_latest(engine.registry), media_type="text/plain")

    with ServerThread(Starlette(routes=[Route("/metrics", metrics)])) as srv:
        dead = f"http://127.0.0.1:{free_port()}/metrics"
        scraper = EngineScraper({"gpu": srv.url + "/metrics", "gone": dead}, timeout_s=2.0)
        text = (await scraper.render(["gpu", "gone"])).decode()
        await scraper.aclose()
    assert 'engine_generated_tokens_total{upstream="gpu"} 7.0' in text
    assert "gone" not in text
    assert scraper.errors == {"gone": 1}
    errors = next(iter(scraper.collector().collect()))
    assert {s.labels["upstream"]: s.value for s in errors.samples} == {"gpu": 0, "gone": 1}
