"""``gateway report LOG...``: the aggregates of a log with junk lines mixed in, the page it
writes, and that page rendered by headless Chromium (Debian's package, installed by
scripts/fetch-chromium.sh) with every plot drawn; end to end, on the stdout of a real
``gateway serve`` after a replay."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from gateway.cli import main
from gateway.tools.replay import load_conversations, replay
from gateway.upstreams.ports import free_port
from tests.conftest import DEFAULT_POLICY, FakeServer, gateway_toml, wait_until_ready


def request(i: int, **fields: Any) -> bytes:
    return orjson.dumps({"request_id": f"r{i}", "ts": f"2025-05-01T12:00:0{i}.000+00:00",
                         "status": 200, "stream": False, **fields, "event": "request"})


JUNK = [
    b'{"event": "gateway_started", "level": "info", "logged_at": "2025-05-01T11:59:59Z"}',
    b"INFO:     Uvicorn running on http://127.0.0.1:8080",
    b"[1, 2]",
    b'{"request_id": "cut", "ts": "2025-05-01T12:00:09.000+00:00", "total_ms": 1',
]

LINES = [
    JUNK[0], JUNK[1],
    request(0, model_served="gpt-4o-2024-08-06", key_id="team-a", stream=True, total_ms=100,
            ttft_ms=20, overhead_ms=1, prompt_tokens=1000, cached_tokens=400,
            cache_read_tokens=400, completion_tokens=100, cache="miss", router="auto",
            route_tier="large"),
    request(1, model_served="gpt-4o-2024-08-06", key_id="team-a", total_ms=5, overhead_ms=5,
            prompt_tokens=1000, completion_tokens=100, cache="hit", cache_layer="exact"),
    JUNK[2],
    request(2, model_served="claude-sonnet-4-5", key_id="team-b", stream=True, total_ms=300,
            ttft_ms=60, overhead_ms=2, prompt_tokens=2000, cached_tokens=1000,
            cache_read_tokens=1000, cache_write_tokens=500, completion_tokens=200,
            cache="miss", router="auto", route_tier="large"),
    b"",
    request(3, model_served="smollm2", total_ms=50, overhead_ms=3, prompt_tokens=50,
            completion_tokens=10, cache="hit", cache_layer="semantic", router="auto",
            route_tier="small"),
    request(4, model_requested="smollm2", status=503, total_ms=2, overhead_ms=2,
            shed="queue_full", error_type="overloaded_error"),
    JUNK[3],
    request(5, model_served="mystery-model", key_id="team-b", stream=True, total_ms=40,
            ttft_ms="fast", overhead_ms=4, prompt_tokens=100, completion_tokens=10,
            cache="bypass"),  # a field of the wrong type counts as missing
    request(6, ts="not a time", model_served="smollm2", total_ms=10, overhead_ms=0.5),
]

PRICES = '["gpt-4o"]\ninput = 2\ncached = 1\noutput = 10\n'


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.log"
    path.write_bytes(b"\n".join(LINES) + b"\n")
    return path


def report(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["report", *args, "--json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_aggregates_count_only_request_lines_and_missing_fields_as_missing(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prices.toml").write_text(PRICES)
    out = report(capsys, str(log), "--prices", str(tmp_path / "prices.toml"))
    assert out["source"] | {"files": None} == {
        "files": None, "lines": 11, "requests": 7, "skipped": 4,
        "first": "2025-05-01T12:00:00.000+00:00", "last": "2025-05-01T12:00:05.000+00:00"}
    s = out["summary"]
    assert (s["requests"], s["errors"], s["shed"], s["streams"]) == (7, 1, 1, 3)
    assert (s["cache_lookups"], s["cache_hits"], s["cache_hit_rate"]) == (5, 2, 0.4)
    # totals [2, 5, 10, 40, 50, 100, 300]; p90 interpolates 100 + 0.4 x 200
    assert out["latency_ms"]["total"] == {"p50": 40, "p90": 180, "p95": 240, "p99": 288,
                                          "max": 300}
    assert out["latency_ms"]["ttft"]["p50"] == 40  # 20 and 60; "fast" is no time
    assert out["latency_ms"]["queue"]["p50"] is None
    assert out["cache"] == {"miss": 2, "hit": 2, "bypass": 1}
    assert out["cache_layers"] == {"exact": 1, "semantic": 1}
    assert out["routes"] == {"large": 2, "small": 1}
    assert (out["shed"], out["status"]) == ({"queue_full": 1}, {"200": 6, "503": 1})
    # Provider-cached input over input that reached an upstream (cache hits left out).
    assert (s["prompt_tokens"], s["cached_tokens"], s["cached_input_share"]) == (
        3100, 1400, 0.4516)
    # gpt-4o at the file's prices: 600 x 2 + 400 x 1 + 100 x 10 per 1M; its cache hit
    # (1000 in, 100 out) saved 3,000 per 1M. claude at the built-in list price:
    # 500 x 3 + 1000 x 0.3 + 500 x 3.75 (writes) + 200 x 15.
    models = {m["model"]: m for m in out["models"]}
    assert list(models) == ["claude-sonnet-4-5", "gpt-4o-2024-08-06", "smollm2",
                            "mystery-model"]
    assert (models["gpt-4o-2024-08-06"]["cost_usd"],
            models["gpt-4o-2024-08-06"]["saved_usd"]) == (0.0026, 0.003)
    assert models["claude-sonnet-4-5"]["cost_usd"] == 0.006675
    assert models["smollm2"]["requests"] == 3 and models["smollm2"]["cost_usd"] == 0
    assert out["unpriced_models"] == ["mystery-model"]
    assert (s["cost_usd"], s["saved_usd"]) == (0.009275, 0.003)
    keys = {k["key"]: k for k in out["keys"]}
    assert {k: (v["requests"], v["cache_hits"]) for k, v in keys.items()} == {
        "team-b": (2, 0), "team-a": (2, 1), "(no key)": (3, 1)}
    # One-second buckets over 5 s; the line with no valid ts is in no bucket.
    assert out["bucket_s"] == 1 and [row["requests"] for row in out["timeline"]] == [1] * 6
    first = out["timeline"][0]
    assert (first["total_p50"], first["ttft_p99"], first["cached_share"]) == (100, 20, 0.4)


def test_the_page_has_a_plot_per_section_with_data_and_says_which_are_empty(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--out", str(page)]) == 0
    html = page.read_text()
    assert "wrote" in capsys.readouterr().err
    assert html.count('<svg class="plot"') == 14
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "Priced at 0 (no list price; pass --prices FILE): mystery-model." in html
    # A log with nothing but times: no cache, routing, tokens or keys. Empty sections say so.
    bare = tmp_path / "bare.log"
    bare.write_bytes(request(0, total_ms=3) + b"\n"
                     + request(1, total_ms=4, status=499, cancelled=True) + b"\n")
    assert main(["report", str(bare), "--out", str(page), "--json"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert (out["summary"]["errors"], out["summary"]["cancelled"]) == (0, 1)  # not an error
    assert (out["cache"], out["routes"], out["models"][0]["model"]) == ({}, {}, "(none)")
    html = page.read_text()
    for empty in ("No cache lookups (cache off).", "No routed requests", "Nothing shed.",
                  "No streamed requests.", "No overhead times.", "No token counts in these logs."):
        assert empty in html
    assert html.count('<svg class="plot"') == 3  # latency, requests, status codes


def test_bad_arguments_and_price_files_are_errors(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.log"), "--json"]) == 2
    assert "no such log file" in capsys.readouterr().err
    assert main(["report", str(log)]) == 2  # neither --out nor --json
    prices = tmp_path / "prices.toml"
    prices.write_text('["gpt-4o"]\ninput = 2\ncached = 1\nouptut = 10\n')
    assert main(["report", str(log), "--json", "--prices", str(prices)]) == 2
    assert f"{prices}: gpt-4o.ouptut: unknown key" in capsys.readouterr().err


# -- rendered by Chromium -----------------------------------------------------------------

def render(page: Path, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran, as headless Chromium dumps it."""
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium on PATH: scripts/fetch-chromium.sh installs it")
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", page.as_uri()],
        capture_output=True, timeout=120, check=True)
    return done.stdout.decode()


def plots_drawn(dom: str) -> tuple[int, int]:
    body = re.search(r"<body ([^>]*)>", dom)
    assert body is not None, dom[:500]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    return int(attrs["data-plots"]), int(attrs["data-plots-drawn"])


def test_chromium_draws_every_plot_of_the_page(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--out", str(page)]) == 0
    dom = render(page, tmp_path)
    assert plots_drawn(dom) == (14, 14)
    assert dom.count('data-drawn="1"') == 14


# -- end to end: a replay through `gateway serve`, its stdout as the log -------------------

KEYS = {"team-a": "sk-report-a", "team-b": "sk-report-b"}
AUTH = "".join(f'\n[[auth.keys]]\nid = "{name}"\nsha256 = "'
               f'{hashlib.sha256(key.encode()).hexdigest()}"\n' for name, key in KEYS.items())


def request_lines(log: Path) -> int:
    return log.read_bytes().count(b'"event":"request"')


async def replay_as(url: str, prompts: Path) -> None:
    """team-a's 3 two-turn conversations on fake-model, team-b's on with-fallback (its first
    target is down), then team-b's again on fake-model, each failing at once (400)."""
    conversations = load_conversations(prompts)
    for key, model, headers in ((KEYS["team-a"], "fake-model", {}),
                                (KEYS["team-b"], "with-fallback", {}),
                                (KEYS["team-b"], "fake-model", {"x-fake-status": "400"})):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                                      default_headers=headers) as client:
            await replay(conversations, client=client, model=model, concurrency=3,
                         max_tokens=16)


def test_a_replay_through_gateway_serve_makes_a_page_chromium_draws(
        tmp_path: Path, fake_server: FakeServer, fake: object,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policy.toml").write_text(DEFAULT_POLICY)
    config = gateway_toml(fake_server.url, AUTH).replace("requests = false", "requests = true")
    (tmp_path / "gateway.toml").write_text(config)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"".join(orjson.dumps({"turns": [f"question {i}", "and then?"]})
                                 + b"\n" for i in range(3)))
    port, log = free_port(), tmp_path / "gateway.log"
    with log.open("wb") as stdout:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gateway"), "serve", "--config",
             str(tmp_path / "gateway.toml"), "--port", str(port)],
            stdout=stdout, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process)
        asyncio.run(replay_as(url, prompts))
        deadline = time.monotonic() + 10  # lines are flushed every 0.2 s
        while request_lines(log) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    page = tmp_path / "report.html"
    out = report(capsys, str(log), "--out", str(page))
    assert (out["source"]["requests"], out["summary"]["errors"]) == (15, 3)
    assert {k["key"]: k["requests"] for k in out["keys"]} == {"team-a": 6, "team-b": 9}
    assert {m["model"]: m["requests"] for m in out["models"]} == {
        "fake-upstream-model": 9, "backup-model": 6}
    assert out["unpriced_models"] == ["backup-model", "fake-upstream-model"]
    assert out["latency_ms"]["ttft"]["p50"] > 0 and out["latency_ms"]["overhead"]["p99"] > 0
    assert out["status"] == {"200": 12, "400": 3}
    drawn = plots_drawn(render(page, tmp_path))
    assert drawn[0] >= 8 and drawn == (drawn[0], drawn[0])
