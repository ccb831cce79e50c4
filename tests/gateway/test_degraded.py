"""Overload and faults as a client sees them: fast, labelled answers, never a silent wait."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import openai
import pytest

from gateway.concurrency import AdmissionPolicy
from gateway.stages.admission import ticket

MESSAGES = [{"role": "user", "content": "hi"}]
ONE_SLOT = """
version = "one-slot"
[retry]
max_attempts = 1
[admission]
max_concurrency = 1
max_queue = 0
"""
TRIP_AFTER_TWO = """
[retry]
max_attempts = 1
[breaker]
consecutive_failures = 2
open_ms = 60000
"""
SMALL = """
[models."small"]
targets = [{ upstream = "backup", model = "small-model" }]
"""


async def _occupy(gw, fake, **headers):
    """Start a slow request that holds the fake upstream's only slot; returns its task."""
    client = httpx.AsyncClient(timeout=30)
    task = asyncio.create_task(client.post(
        gw.v1 + "/chat/completions", json={"model": "fake-model", "messages": MESSAGES},
        headers={"x-fake-ttft-ms": "5000", **headers}))
    await asyncio.to_thread(fake.wait_for, lambda recs: recs)
    return task, client


async def _release(task, client):
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()


async def test_overload_is_rejected_at_once_with_a_labelled_503(make_gateway, fake):
    gw = make_gateway(policy=ONE_SLOT)
    task, client = await _occupy(gw, fake)
    async with httpx.AsyncClient() as c:
        r = await c.post(gw.v1 + "/chat/completions",
                         json={"model": "fake-model", "messages": MESSAGES})
    await _release(task, client)
    assert r.status_code == 503
    assert r.headers["x-gateway-degraded"] == "queue_full"
    after_s = int(r.headers["retry-after"])
    assert after_s >= 1
    # The SDKs read retry-after-ms first: jittered in [1, 2) x Retry-After, so clients shed
    # together do not all come back in the same instant.
    assert after_s * 1000 <= int(r.headers["retry-after-ms"]) < 2 * after_s * 1000
    err = r.json()["error"]
    assert err["type"] == "overloaded_error" and err["code"] == "degraded_mode"
    shed = [rec for rec in gw.logged(2) if rec["status"] == 503]
    assert shed[0]["shed"] == "queue_full"
    metrics = gw.gateway.metrics.render().decode()
    assert 'gateway_shed_total{reason="queue_full",route="/v1/chat/completions"} 1.0' in metrics


async def test_overload_reroutes_to_the_small_model_when_the_policy_says_so(make_gateway, fake):
    gw = make_gateway(extra=SMALL,
                      policy=ONE_SLOT + '[degraded]\nreroute_model = "small"\n')
    task, client = await _occupy(gw, fake)
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        raw = await c.chat.completions.with_raw_response.create(model="fake-model",
                                                                messages=MESSAGES)
    await _release(task, client)
    reply = raw.parse()
    assert reply.model == "small-model"
    assert raw.headers["x-gateway-degraded"] == "rerouted:queue_full"
    rerouted = [rec for rec in gw.logged(2) if rec["shed"]]
    assert rerouted[0]["shed"] == "rerouted:queue_full" and rerouted[0]["status"] == 200


async def test_a_queued_request_waits_for_the_slot_and_logs_its_wait(make_gateway, fake):
    gw = make_gateway(policy=ONE_SLOT.replace("max_queue = 0", "max_queue = 4"))
    async with httpx.AsyncClient(timeout=30) as c:
        first = asyncio.create_task(c.post(
            gw.v1 + "/chat/completions", json={"model": "fake-model", "messages": MESSAGES},
            headers={"x-fake-ttft-ms": "200"}))
        await asyncio.to_thread(fake.wait_for, lambda recs: recs)
        second = await c.post(gw.v1 + "/chat/completions",
                              json={"model": "fake-model", "messages": MESSAGES})
        assert (await first).status_code == 200
    assert second.status_code == 200
    records = gw.logged(2)
    assert max(rec["queue_ms"] for rec in records) > 0


TENANT = f"""
[[auth.keys]]
id = "team-a"
sha256 = "{hashlib.sha256(b'sk-a').hexdigest()}"
"""


async def test_a_key_over_its_own_limit_gets_429(make_gateway, fake):
    gw = make_gateway(extra=TENANT, policy="[admission]\nper_key_max_concurrency = 1\n")
    task, client = await _occupy(gw, fake, authorization="Bearer sk-a")
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key="sk-a", max_retries=0) as c:
        with pytest.raises(openai.RateLimitError) as exc:
            await c.chat.completions.create(model="fake-model", messages=MESSAGES)
    await _release(task, client)
    assert exc.value.response.headers["x-gateway-degraded"] == "tenant_limit"
    assert exc.value.code == "degraded_mode"


def test_open_breaker_sheds_fast_and_shows_in_readyz_and_metrics(make_gateway, fake):
    gw = make_gateway(policy=TRIP_AFTER_TWO)
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                c.chat.completions.create(model="fake-model", messages=MESSAGES,
                                          extra_headers={"x-fake-status": "500"})
        with pytest.raises(openai.InternalServerError) as exc:
            c.chat.completions.create(model="fake-model", messages=MESSAGES)
    r = exc.value.response
    assert r.status_code == 503 and r.headers["x-gateway-degraded"] == "breaker_open"
    assert 55 <= int(r.headers["retry-after"]) <= 60
    assert len(fake.records) == 2  # the third never reached the upstream
    ready = httpx.get(gw.url + "/readyz").json()
    assert "fake" not in ready["upstreams"]
    assert 'gateway_breaker_state{upstream="fake"} 2.0' in httpx.get(gw.url + "/metrics").text


def test_streams_the_upstream_breaks_midway_count_as_failures(make_gateway, fake):
    gw = make_gateway(policy=TRIP_AFTER_TWO)
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        for _ in range(2):  # 200 and a first chunk, then the connection drops
            stream = c.chat.completions.create(model="fake-model", messages=MESSAGES,
                                               stream=True,
                                               extra_headers={"x-fake-die-after": "2"})
            with pytest.raises(openai.APIError):
                for _ in stream:
                    pass
        with pytest.raises(openai.InternalServerError) as exc:
            c.chat.completions.create(model="fake-model", messages=MESSAGES, stream=True)
    assert exc.value.response.headers["x-gateway-degraded"] == "breaker_open"
    assert len(fake.records) == 2


def test_empty_retry_budget_means_no_retry(make_gateway, fake):
    gw = make_gateway(policy="[retry_budget]\nmax_tokens = 0\n")
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c, \
            pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="fake-model", messages=MESSAGES, extra_headers={
            "x-fake-fail-times": "1", "x-fake-key": "budget"})
    assert len(fake.records) == 1
    assert gw.gateway.dispatcher.budget.denied == 1


def test_retry_budget_refills_with_first_attempts():
    from gateway.retry_budget import RetryBudget, RetryBudgetPolicy

    budget = RetryBudget(RetryBudgetPolicy(ratio=0.5, max_tokens=1))
    assert budget.withdraw() and not budget.withdraw()
    budget.deposit(), budget.deposit()
    assert budget.withdraw()


def test_priority_comes_from_the_key_and_the_header_may_only_lower_it():
    policy = AdmissionPolicy(key_priority={"vip": "high"}, long_prompt_bytes=100)
    header = [(b"x-gateway-priority", b"LOW")]
    assert ticket(policy, "vip", [], 10).priority == "high"
    assert ticket(policy, "vip", header, 10).priority == "low"
    assert ticket(policy, "other", header, 10).priority == "low"
    assert ticket(policy, "other", [(b"x-gateway-priority", b"high")], 10).priority == "normal"
    assert ticket(policy, None, [(b"x-gateway-priority", b"urgent")], 10).priority == "normal"
    assert ticket(policy, None, [], 101).long is True


async def test_a_model_with_its_own_limit_is_shed_while_others_are_served(make_gateway, fake):
    gw = make_gateway(extra=SMALL, policy="""
[admission]
max_queue = 0
model_max_concurrency = { "fake-model" = 1 }
""")
    task, client = await _occupy(gw, fake)
    async with httpx.AsyncClient() as c:
        over = await c.post(gw.v1 + "/chat/completions",
                            json={"model": "fake-model", "messages": MESSAGES})
        other = await c.post(gw.v1 + "/chat/completions",
                             json={"model": "small", "messages": MESSAGES})
    await _release(task, client)
    assert over.status_code == 503 and over.headers["x-gateway-degraded"] == "queue_full"
    assert other.status_code == 200
