"""The gateway as a drop-in OpenAI endpoint: the official SDK in front, the fake upstream behind."""

from __future__ import annotations

import asyncio
import hashlib
import time

import httpx
import openai
import orjson
import pytest
from threadpoolctl import threadpool_info

from gateway.requestlog import FIELDS

MESSAGES = [{"role": "user", "content": "Say hi"}]


def client(gw, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="sk-client", max_retries=0, **kw)


def aclient(gw, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key="sk-client", max_retries=0, **kw)


def test_sync_non_streaming_rewrites_model_and_logs_one_line(gw, fake):
    with client(gw) as c:
        r = c.chat.completions.create(model="fake-model", messages=MESSAGES)
    assert r.choices[0].message.content == "w0 w1 w2 w3 w4 w5 w6 w7"
    assert r.model == "fake-upstream-model"
    assert fake.records[0].json["model"] == "fake-upstream-model"
    assert fake.records[0].json["messages"] == MESSAGES
    [rec] = gw.logged()
    assert set(rec) == set(FIELDS)
    assert rec["status"] == 200 and rec["stream"] is False and rec["upstream"] == "fake"
    assert rec["model_requested"] == "fake-model" and rec["model_served"] == "fake-upstream-model"
    assert rec["completion_tokens"] == 8 and rec["finish_reason"] == "stop"
    assert rec["overhead_ms"] == pytest.approx(rec["total_ms"] - rec["upstream_ms"], abs=0.01)


def test_alias_resolves(gw, fake):
    with client(gw) as c:
        r = c.chat.completions.create(model="fm", messages=MESSAGES)
    assert r.model == "fake-upstream-model"


async def test_async_streaming_forwards_every_event(gw, fake):
    async with aclient(gw) as c:
        stream = await c.chat.completions.create(model="fake-model", messages=MESSAGES,
                                                 stream=True)
        chunks = [chunk async for chunk in stream]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "w0 w1 w2 w3 w4 w5 w6 w7"
    # The gateway asked for usage for its own log but hid the usage chunk from this client.
    assert all(ch.choices for ch in chunks)
    assert fake.records[0].json["stream_options"] == {"include_usage": True}
    [rec] = gw.logged()
    assert rec["stream"] is True and rec["completion_tokens"] == 8
    assert rec["ttft_ms"] is not None and rec["finish_reason"] == "stop"


def test_streaming_usage_is_forwarded_when_the_client_asks(gw, fake):
    with client(gw) as c:
        chunks = list(c.chat.completions.create(
            model="fake-model", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_sse_headers(gw, fake):
    with httpx.stream("POST", gw.v1 + "/chat/completions",
                      json={"model": "fake-model", "messages": MESSAGES, "stream": True}) as r:
        body = r.read()
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no"
    assert r.headers["cache-control"] == "no-cache"
    assert body.endswith(b"data: [DONE]\n\n")


def test_request_id_is_taken_from_the_client_and_returned(gw, fake):
    r = httpx.post(gw.v1 + "/chat/completions", headers={"x-request-id": "req-123"},
                   json={"model": "fake-model", "messages": MESSAGES})
    assert r.headers["x-request-id"] == "req-123"
    assert fake.records[0].request_id == "req-123"
    assert gw.logged()[0]["request_id"] == "req-123"
    made = httpx.post(gw.v1 + "/chat/completions", json={"model": "fake-model",
                                                           "messages": MESSAGES})
    assert len(made.headers["x-request-id"]) == 32


def test_completions_and_embeddings_are_proxied(gw, fake):
    with client(gw) as c:
        comp = c.completions.create(model="fake-model", prompt="Once upon")
        emb = c.embeddings.create(model="fake-model", input=["a", "b"])
    assert comp.choices[0].text.startswith("w0")
    assert len(emb.data) == 2
    assert [r.path for r in fake.records] == ["/v1/completions", "/v1/embeddings"]


def test_models_lists_names_and_aliases(gw):
    with client(gw) as c:
        ids = {m.id for m in c.models.list()}
    assert {"fake-model", "fm", "with-fallback"} <= ids


def test_allowed_v1_paths_pass_through_byte_for_byte(gw, fake):
    payload = bytes(range(256)) * 4
    r = httpx.post(gw.v1 + "/audio/transcriptions?language=en", content=payload,
                   headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.content == payload
    assert r.headers["x-fake-path"] == "/v1/audio/transcriptions"
    assert fake.records[0].method == "POST"
    assert gw.logged()[0]["route"] == "passthrough"
    assert gw.logged()[0]["path"] == "/v1/audio/transcriptions"


def test_numpy_blas_runs_on_one_thread_once_the_gateway_serves(gw):
    """Its small matrix products run on the event loop: a multi-threaded BLAS call there
    waits for worker threads a busy CPU may not schedule (gateway.app.single_threaded_blas)."""
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)


def test_health_and_metrics(gw, fake):
    assert httpx.get(gw.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(gw.url + "/readyz").status_code == 200
    with client(gw) as c:
        c.chat.completions.create(model="fake-model", messages=MESSAGES)
    text = httpx.get(gw.url + "/metrics").text
    assert ('gateway_requests_total{model="fake-upstream-model",'
            'route="/v1/chat/completions",status="200"} 1.0') in text
    assert "gateway_overhead_seconds_bucket" in text


# -- errors ------------------------------------------------------------------------------

def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    (b"{not json", 400, "invalid_json", None),
    (b"[1, 2]", 400, "invalid_request", None),
    (b'{"messages": []}', 400, "missing_required_parameter", "model"),
    (b'{"model": 3, "messages": []}', 400, "invalid_type", "model"),
    (b'{"model": "fake-model"}', 400, "missing_required_parameter", "messages"),
    (b'{"model": "fake-model", "messages": "hi"}', 400, "invalid_type", "messages"),
    (b'{"model": "fake-model", "messages": []}', 400, "invalid_value", "messages"),
    (b'{"model": "fake-model", "messages": [{"content": "x"}]}', 400, "invalid_type",
     "messages[0].role"),
    (b'{"model": "fake-model", "messages": [{"role": "user"}], "stream": "yes"}', 400,
     "invalid_type", "stream"),
    (b'{"model": "fake-model", "messages": [{"role": "user"}], "temperature": 9}', 400,
     "invalid_value", "temperature"),
    (b'{"model": "nope", "messages": [{"role": "user"}]}', 404, "model_not_found", "model"),
    # what could not be sent on as it came: orjson writes 254 levels at most, and reads an
    # integer past 64 bits as a float (another number upstream)
    (b'{"model": "fake-model", "messages": [{"role": "user"}], "x": ' + b"[" * 300
     + b"]" * 300 + b"}", 400, "invalid_value", None),
    (b'{"model": "fake-model", "messages": [{"role": "user"}], "seed": 18446744073709551616}',
     400, "invalid_value", None),
])
def test_bad_requests_get_openai_errors(gw, fake, body, status, code, param):
    r = httpx.post(gw.v1 + "/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status
    err = _error(r)
    assert err["code"] == code and err["param"] == param
    assert not fake.records  # nothing reached the upstream
    assert gw.logged()[0]["status"] == status


def test_unknown_model_raises_not_found_in_the_sdk(gw):
    with client(gw) as c, pytest.raises(openai.NotFoundError) as exc:
        c.chat.completions.create(model="gpt-nonexistent", messages=MESSAGES)
    assert exc.value.code == "model_not_found"


def test_body_over_the_limit_gets_413(gw, fake):
    big = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = httpx.post(gw.v1 + "/chat/completions", json=big)
    assert r.status_code == 413 and _error(r)["code"] == "request_too_large"
    assert not fake.records


def test_unreachable_upstream_gets_502(make_gateway):
    gw = make_gateway(extra="""
[models."dead-only"]
targets = [{ upstream = "dead", model = "x" }]
""")
    with client(gw) as c, pytest.raises(openai.APIStatusError) as exc:
        c.chat.completions.create(model="dead-only", messages=MESSAGES)
    assert exc.value.status_code == 502
    assert exc.value.code == "upstream_unreachable"
    assert gw.logged()[0]["retries"] == 2 and gw.logged()[0]["error_type"] == "upstream_error"


def test_upstream_timeout_gets_504_without_retry(gw, fake):
    with client(gw) as c, pytest.raises(openai.APIStatusError) as exc:
        c.chat.completions.create(model="short-timeout", messages=MESSAGES,
                                  extra_headers={"x-fake-ttft-ms": "3000"})
    assert exc.value.status_code == 504 and exc.value.code == "upstream_timeout"
    assert len(fake.records) == 1


def test_model_without_an_enabled_upstream_gets_503(gw):
    with client(gw) as c, pytest.raises(openai.APIStatusError) as exc:
        c.chat.completions.create(model="needs-key", messages=MESSAGES)
    assert exc.value.status_code == 503 and exc.value.code == "no_upstream_available"


def test_not_found_route_is_an_openai_error(gw):
    r = httpx.get(gw.url + "/nope")
    assert r.status_code == 404 and _error(r)["code"] == "not_found"


# -- retries and fallback ----------------------------------------------------------------

def test_5xx_is_retried_until_success(gw, fake):
    with client(gw) as c:
        r = c.chat.completions.create(model="fake-model", messages=MESSAGES, extra_headers={
            "x-fake-fail-times": "2", "x-fake-key": "retry-5xx"})
    assert r.choices[0].message.content
    assert len(fake.records) == 3 and gw.logged()[0]["retries"] == 2


def test_retry_after_is_honoured(gw, fake):
    started = time.monotonic()
    with client(gw) as c:
        c.chat.completions.create(model="fake-model", messages=MESSAGES, extra_headers={
            "x-fake-fail-times": "1", "x-fake-key": "retry-after", "x-fake-status": "429",
            "x-fake-retry-after-ms": "300"})
    second = fake.records[1].arrived
    assert second - fake.records[0].arrived >= 0.3
    assert time.monotonic() - started >= 0.3


def test_long_retry_after_is_not_waited_for_and_the_429_passes_through(gw, fake):
    with client(gw) as c, pytest.raises(openai.RateLimitError) as exc:
        c.chat.completions.create(model="fake-model", messages=MESSAGES, extra_headers={
            "x-fake-status": "429", "x-fake-retry-after": "30"})
    assert exc.value.response.headers["retry-after"] == "30"
    assert len(fake.records) == 1


def test_fallback_to_the_next_target(gw, fake):
    with client(gw) as c:
        r = c.chat.completions.create(model="with-fallback", messages=MESSAGES, stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
    assert text.startswith("w0")
    assert fake.records[0].path == "/backup/v1/chat/completions"
    assert fake.records[0].json["model"] == "backup-model"
    rec = gw.logged()[0]
    assert rec["upstream"] == "backup" and rec["retries"] == 3


def test_streaming_retries_before_the_first_byte(gw, fake):
    with client(gw) as c:
        chunks = list(c.chat.completions.create(
            model="fake-model", messages=MESSAGES, stream=True,
            extra_headers={"x-fake-fail-times": "1", "x-fake-key": "stream-retry"}))
    assert chunks and len(fake.records) == 2


def test_upstream_dying_mid_stream_is_an_error_event_not_done(gw, fake):
    r = httpx.post(gw.v1 + "/chat/completions", headers={"x-fake-die-after": "3"},
                   json={"model": "fake-model", "messages": MESSAGES, "stream": True})
    assert r.status_code == 200
    assert b"[DONE]" not in r.content
    events = [e for e in r.content.split(b"\n\n") if e]
    last = orjson.loads(events[-1].removeprefix(b"data: "))
    assert last["error"]["type"] == "upstream_error"
    assert b'"content":"w2"' in r.content or b'"content":"w2 "' in r.content
    assert len(fake.records) == 1  # no retry once bytes reached the client
    assert gw.logged()[0]["error_type"] == "upstream_error"


@pytest.mark.parametrize("itl_ms", ["100", "1500"])
def test_an_upstream_silent_mid_stream_past_its_read_timeout_is_an_error_event(gw, fake, itl_ms):
    # "short" has read_timeout_ms = 300: events 100 ms apart flow, 1.5 s apart time out.
    started = time.monotonic()
    r = httpx.post(gw.v1 + "/chat/completions", timeout=10,
                   headers={"x-fake-itl-ms": itl_ms, "x-fake-tokens": "4"},
                   json={"model": "short-timeout", "messages": MESSAGES, "stream": True})
    events = [e for e in r.content.split(b"\n\n") if e]
    if itl_ms == "100":
        assert events[-1] == b"data: [DONE]"
        assert gw.logged()[0]["error_type"] is None
    else:
        last = orjson.loads(events[-1].removeprefix(b"data: "))
        assert last["error"]["code"] == "upstream_timeout" and b"[DONE]" not in r.content
        assert 0.3 <= time.monotonic() - started < 1.5
        assert gw.logged()[0]["error_code"] == "upstream_timeout"


def test_sdk_raises_on_mid_stream_failure(gw, fake):
    with client(gw) as c, pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(model="fake-model", messages=MESSAGES, stream=True,
                                           extra_headers={"x-fake-die-after": "2"}):
            pass


# -- auth and keys -----------------------------------------------------------------------

AUTH = f"""
[[auth.keys]]
id = "team-a"
sha256 = "{hashlib.sha256(b'sk-team-a').hexdigest()}"

[upstreams.keyed]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{{fake}}"
api_key_env = "GATEWAY_TEST_UPSTREAM_KEY"

[models."keyed-model"]
targets = [{{ upstream = "keyed", model = "k" }}]
"""


def test_gateway_keys_and_upstream_key_replacement(make_gateway, fake_server, fake,
                                                   monkeypatch):
    monkeypatch.setenv("GATEWAY_TEST_UPSTREAM_KEY", "sk-upstream-secret")
    gw = make_gateway(extra=AUTH.replace("{fake}", fake_server.url + "/v1"))
    r = httpx.post(gw.v1 + "/chat/completions", json={"model": "keyed-model",
                                                        "messages": MESSAGES})
    assert r.status_code == 401 and _error(r)["type"] == "authentication_error"
    with openai.OpenAI(base_url=gw.v1, api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.chat.completions.create(model="keyed-model", messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    with openai.OpenAI(base_url=gw.v1, api_key="sk-team-a", max_retries=0) as c:
        c.chat.completions.create(model="keyed-model", messages=MESSAGES)
    [seen] = fake.records
    assert seen.headers["authorization"] == "Bearer sk-upstream-secret"
    assert gw.logged(3)[-1]["key_id"] == "team-a"
    logged = orjson.dumps(gw.logged())
    assert b"sk-team-a" not in logged and b"sk-upstream-secret" not in logged
    assert b"Say hi" not in logged  # nor any prompt text


def test_client_key_is_never_forwarded(gw, fake):
    with client(gw) as c:
        c.chat.completions.create(model="fake-model", messages=MESSAGES)
    assert "authorization" not in fake.records[0].headers


# -- client disconnects ------------------------------------------------------------------

def _disconnected(fake):
    return fake.wait_for(lambda recs: recs and recs[0].disconnected, timeout=5) and \
        fake.records[0].disconnected


@pytest.mark.parametrize("stream", [True, False])
async def test_abort_before_first_token_reaches_upstream(gw, fake, stream):
    # How soon is bench/cancel.py's to measure (p50 ~1 ms); a test asserts that it does,
    # long before the upstream's first token (10 s), not a time that a loaded machine moves.
    async with aclient(gw) as c:
        task = asyncio.create_task(c.chat.completions.create(
            model="fake-model", messages=MESSAGES, stream=stream,
            extra_headers={"x-fake-ttft-ms": "10000"}))
        await asyncio.to_thread(fake.wait_for, lambda recs: recs)
        aborted = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    seen = await asyncio.to_thread(_disconnected, fake)
    assert seen - aborted < 5
    [rec] = await asyncio.to_thread(gw.logged)
    assert rec["cancelled"] is True and rec["status"] == 499


def test_abort_mid_stream_reaches_upstream(gw, fake):
    with client(gw) as c:
        stream = c.chat.completions.create(
            model="fake-model", messages=MESSAGES, stream=True,
            extra_headers={"x-fake-itl-ms": "50", "x-fake-tokens": "1000"})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        aborted = time.monotonic()
        stream.close()
    seen = _disconnected(fake)
    assert seen - aborted < 5  # at 50 ms a token, 1000 tokens would take 50 s
    assert fake.records[0].chunks_sent < 1000


def test_upstream_cookies_are_neither_kept_nor_forwarded(make_gateway, fake_server, fake):
    # By host name: HTTP clients keep cookies for names, not for bare IP addresses.
    url = fake_server.url.replace("127.0.0.1", "localhost")
    gw = make_gateway(extra=f"""
[upstreams.named]
type = "openai"
forward_headers = ["x-fake-*"]
base_url = "{url}/v1"
[models."named-model"]
targets = [{{ upstream = "named", model = "n" }}]
""")
    body = {"model": "named-model", "messages": MESSAGES}
    first = httpx.post(gw.v1 + "/chat/completions", json=body,
                       headers={"x-fake-set-cookie": "sid=alice; Path=/"})
    assert first.status_code == 200 and "set-cookie" not in first.headers
    httpx.post(gw.v1 + "/chat/completions", json=body)
    assert "cookie" not in fake.records[1].headers


def test_a_stream_the_client_received_whole_is_logged_as_delivered(gw, fake):
    """The gateway reads the upstream's body tail after [DONE] once the client has the whole
    answer; the client going away then is no cancellation (the answer was delivered)."""
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        stream = c.chat.completions.create(
            model="fake-model", stream=True, messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-fake-itl-ms": "30", "x-fake-tail-ms": "300"})
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    [record] = gw.logged(1)
    assert (record["status"], record["cancelled"], record["finish_reason"]) == \
        (200, False, "stop")


def test_usage_asked_of_the_upstream_when_the_client_turned_it_off(gw, fake):
    with client(gw) as c:
        chunks = list(c.chat.completions.create(
            model="fake-model", messages=MESSAGES, stream=True,
            stream_options={"include_usage": False}))
    assert all(ch.choices for ch in chunks)  # no usage chunk for this client
    assert fake.records[0].json["stream_options"] == {"include_usage": True}
    [rec] = gw.logged()
    assert rec["completion_tokens"] == 8
