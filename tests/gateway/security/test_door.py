"""Issue 45, the door: findings 1, 2 (pass-through), 3, 8 and 10 (pass-through charges),
reproduced as an attacker holding one tenant's gateway key (or none) would, over real HTTP
against a gateway whose upstream is a path-recording, header-echoing fake provider
(gateway.testing.recorder) behind a base path (``/tenant/v1``).

Raw request targets go out through http.client, which sends them byte for byte (httpx
would resolve the dot segments before sending).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import orjson
import pytest

from gateway.app import create_app
from gateway.config import UpstreamConfig, load_config
from gateway.testing.recorder import Recorder
from gateway.testing.server import ServerThread, free_port
from tests.conftest import DEFAULT_POLICY

UPSTREAM_KEY = "sk-upstream-secret"
KEYS = {"team-a": "key-a-secret", "team-b": "key-b-secret"}
HELLO = [{"role": "user", "content": "hi"}]
#: A path variant of each kind the review reproduced (finding 1).
CHAT_SPELLINGS = ("/v1/./chat/completions", "/v1/%2E/chat/completions",
                  "/v1//chat/completions", "/v1/chat/completions/", "/v1/chat%2Fcompletions",
                  "/v1/models/../chat/completions", "/v1/../v1/chat/completions")


def supports(cls: type, name: str) -> bool:
    """Whether this gateway's config has the field (so these tests also run, and fail, on
    the code before issue 45, where a key it lacks would be a config error)."""
    return name in {f.name for f in dataclasses.fields(cls)}


@dataclasses.dataclass
class Door:
    url: str
    rec: Recorder
    server: ServerThread

    def raw(self, method: str, target: str, *, key: str | None = "team-a",
            headers: dict[str, str] | None = None, body: bytes | None = None
            ) -> tuple[int, dict[str, str], bytes]:
        """One request with ``target`` sent as it is; (status, headers, body)."""
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        try:
            out = dict(headers or {})
            if key is not None:
                out["Authorization"] = f"Bearer {KEYS[key]}"
            conn.request(method, target, body=body, headers=out)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, \
                response.read()
        finally:
            conn.close()

    def chat(self, target: str, model: str = "door-model", key: str = "team-a",
             **body: Any) -> tuple[int, dict[str, Any]]:
        status, _, data = self.raw("POST", target, key=key, body=orjson.dumps(
            {"model": model, "messages": HELLO, **body}),
            headers={"content-type": "application/json"})
        return status, orjson.loads(data)

    def sdk(self, key: str = "team-a") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEYS[key], max_retries=0)

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics").text


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[Recorder, str]]:
    app = Recorder()
    with ServerThread(app) as srv:
        yield app, srv.url


@pytest.fixture
def make_door(tmp_path: Path, recorder: tuple[Recorder, str],
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Door]]:
    """A gateway whose one upstream ``rec`` is the recorder at ``{url}/tenant/v1``, with
    the gateway keys of KEYS, model ``door-model`` on it; ``upstream``, ``server``: lines
    added to those tables, ``key_extra``: to a key's; ``extra``: more tables."""
    monkeypatch.setenv("DOOR_UPSTREAM_KEY", UPSTREAM_KEY)
    servers: list[ServerThread] = []
    app, url = recorder
    app.clear()

    def make(upstream: str = "", extra: str = "", policy: str = DEFAULT_POLICY,
             server: str = "", key_extra: dict[str, str] | None = None) -> Door:
        keys = "".join(f'[[auth.keys]]\nid = "{kid}"\n'
                       f'sha256 = "{hashlib.sha256(secret.encode()).hexdigest()}"\n'
                       f'{(key_extra or {}).get(kid, "")}\n'
                       for kid, secret in KEYS.items())
        (tmp_path / "policy.toml").write_text(policy)
        (tmp_path / "gateway.toml").write_text(f"""
[server]
policy = "policy.toml"
{server}
[logging]
requests = false

[upstreams.rec]
type = "openai"
base_url = "{url}/tenant/v1"
api_key_env = "DOOR_UPSTREAM_KEY"
{upstream}

[models."door-model"]
targets = [{{ upstream = "rec", model = "upstream-model" }}]

{keys}
{extra}
""")
        srv = ServerThread(create_app(load_config(tmp_path / "gateway.toml"),
                                      watch_policy=False)).start()
        servers.append(srv)
        return Door(srv.url, app, srv)

    yield make
    for srv in servers:
        srv.stop()


def outside_base(rec: Recorder) -> list[str]:
    """Raw paths the upstream saw outside its base path (with the gateway's key)."""
    return [s.raw_path for s in rec.seen if not s.raw_path.startswith("/tenant/v1/")
            or "/.." in s.raw_path or "%2e" in s.raw_path.lower()]


# --- finding 1: one canonical path at the door -----------------------------------------------

def test_every_spelling_of_chat_completions_is_the_chat_endpoint(
        make_door: Callable[..., Door]) -> None:
    """A model the config never names is the model table's 404 whatever the path's spelling
    (it answered 200 from the upstream, past the model table); a named one is rewritten to
    its upstream model, as on the exact path."""
    door = make_door()
    for target in CHAT_SPELLINGS:
        status, body = door.chat(target, model="never-configured")
        assert (target, status, body.get("error", {}).get("code")) == (
            target, 404, "model_not_found")
    assert door.rec.seen == []
    for target in CHAT_SPELLINGS:
        assert door.chat(target)[0] == 200, target
    assert {s.raw_path for s in door.rec.seen} == {"/tenant/v1/chat/completions"}
    assert {orjson.loads(s.body)["model"] for s in door.rec.seen} == {"upstream-model"}


def test_a_path_variant_is_held_to_the_keys_token_limit(make_door: Callable[..., Door]) -> None:
    """3 of 3 requests over a 3,000 tokens/minute limit went through by path variants; now
    each is the chat endpoint's, and the third (1,000 tokens each, reserved) is refused."""
    door = make_door(policy=DEFAULT_POLICY + "\n[rate_limits]\n"
                     "default = { tokens_per_minute = 3000 }\n")
    statuses = [door.chat(target, max_tokens=1000)[0] for target in CHAT_SPELLINGS[:3]]
    assert statuses == [200, 200, 429]
    assert len(door.rec.seen) == 2


HOSTILE = (
    "/v1/..%2F..%2Finternal/admin", "/v1/../../internal/admin",
    "/v1/%2e%2e/%2e%2e/internal/admin", "/v1/moderations/..%2F..%2F..%2Finternal/admin",
    "/v1/moderations/%2e%2e/%2e%2e/%2e%2e/internal/admin",
    "/v1/moderations%2F..%2F..%2F..%2Finternal", "/v1/audio/speech/..%5C..%5C..%5Cinternal",
    "/v1/moderations/%252e%252e/%252e%252e/%252e%252e/internal",
    "/v1/images/generations/;/../../../internal", "/v1/moderations\\..\\..\\internal",
    "/v1/moderations?x=/../../../internal/admin", "/v1/moderations?%2F..%2F..%2Finternal",
)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_no_request_reaches_a_path_outside_the_upstreams_base_path(
        make_door: Callable[..., Door], method: str) -> None:
    """``GET /v1/..%2F..%2Finternal/admin`` reached the upstream host as ``/internal/admin``
    with the gateway's own key; now a path climbing above the root is a 400 in OpenAI's
    format, and what is forwarded stays under ``/tenant/v1/``."""
    door = make_door()
    for target in HOSTILE:
        status, headers, body = door.raw(method, target,
                                         body=b"{}" if method == "POST" else None)
        assert status in (200, 400, 404), (target, status)
        if status == 400 and headers.get("content-type") == "application/json":
            assert orjson.loads(body)["error"]["code"] == "invalid_path"
    assert outside_base(door.rec) == []
    assert door.raw(method, HOSTILE[0])[0] == 400
    assert all(s.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" for s in door.rec.seen)
    forwarded = [s for s in door.rec.seen if s.raw_path == "/tenant/v1/moderations"]
    assert [s.query.replace("%2F", "/") for s in forwarded][-2:] == [
        "x=/../../../internal/admin", "/../../internal"]  # the query went, the path stayed


def test_only_allow_listed_paths_are_passed_through(make_door: Callable[..., Door]) -> None:
    """Any other /v1 path was forwarded under the gateway's key; now only the upstream's
    allow-list (by default the stateless endpoints) is, the rest is a 404 in OpenAI's
    format that never leaves the gateway."""
    door = make_door()
    refused = [("GET", "/v1/files"), ("POST", "/v1/files"), ("GET", "/v1/batches"),
               ("GET", "/v1/chat/completions"), ("GET", "/v1/chat/completions/chatcmpl-1"),
               ("DELETE", "/v1/chat/completions/chatcmpl-1"), ("GET", "/v1/vector_stores"),
               ("GET", "/v1/fine_tuning/jobs"), ("GET", "/v1/organization/users"),
               ("POST", "/v1/uploads"), ("GET", "/v1/models/upstream-model"),
               ("GET", "/v1/responses"), ("POST", "/v1/responses/input_tokens"),
               ("GET", "/v1/conversations/conv_1"), ("GET", "/v1/anything/at/all")]
    for method, target in refused:
        status, _, body = door.raw(method, target)
        assert (method, target, status) == (method, target, 404)
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert door.rec.seen == []
    status, _, body = door.raw("POST", "/v1/moderations", body=b'{"input": "x"}')
    assert status == 200 and orjson.loads(body)["raw_path"] == "/tenant/v1/moderations"


def test_a_stored_response_is_always_the_gateways_own(make_door: Callable[..., Door]) -> None:
    """``/v1/responses/{id}`` by any spelling is the gateway's response store (its 404 for an
    id it does not hold, never forwarded): B's GET and DELETE of A's responses reached the
    upstream through path variants."""
    door = make_door()
    for method, target in [("GET", "/v1/./responses/resp_a"), ("GET", "/v1/responses//resp_a/"),
                           ("DELETE", "/v1/%2E/responses/resp_a"),
                           ("GET", "/v1/responses/resp_a/input_items/"),
                           ("POST", "/v1/responses/resp_a/other"),
                           ("PUT", "/v1/responses/resp_a")]:
        assert (target, door.raw(method, target)[0]) == (target, 404)
    assert door.rec.seen == []


# --- finding 2 (pass-through): tenants under one upstream key ---------------------------------

def test_key_b_never_reaches_key_a_files(make_door: Callable[..., Door]) -> None:
    """With files and batches passed through (an operator's choice), each key reaches only
    the objects it created: B's read, download, delete and list of A's file, and a batch
    over it, are 404s (they went out under the one upstream key)."""
    allowed = 'passthrough = ["/v1/files/**", "/v1/batches/**"]' \
        if supports(UpstreamConfig, "passthrough") else ""
    door = make_door(upstream=allowed)
    with door.sdk("team-a") as a, door.sdk("team-b") as b:
        mine = a.files.create(file=("a.jsonl", b"A's secret"), purpose="batch").id
        theirs = b.files.create(file=("b.jsonl", b"B's own"), purpose="batch").id
        for attempt in (lambda: b.files.retrieve(mine), lambda: b.files.content(mine).read(),
                        lambda: b.files.delete(mine),
                        lambda: b.batches.create(input_file_id=mine, completion_window="24h",
                                                 endpoint="/v1/chat/completions")):
            with pytest.raises(openai.NotFoundError):
                attempt()
        assert [f.id for f in b.files.list()] == [theirs]
        for target in (f"/v1/files/{mine}/./content", f"/v1/files//{mine}",
                       f"/v1/batches/../files/{mine}"):
            assert door.raw("GET", target, key="team-b")[0] == 404, target
        assert a.files.retrieve(mine).id == mine
        assert b"A's secret" in a.files.content(mine).read()
        assert [f.id for f in a.files.list()] == [mine]
        batch = a.batches.create(input_file_id=mine, completion_window="24h",
                                 endpoint="/v1/chat/completions")
        output = a.batches.retrieve(batch.id).output_file_id
        assert output is not None and a.files.content(output).read() == b"batch output"
        with pytest.raises(openai.NotFoundError):
            b.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            b.files.content(output).read()
        assert a.files.delete(mine).deleted
        with pytest.raises(openai.NotFoundError):
            a.files.retrieve(mine)


# --- finding 3: bounded metrics ---------------------------------------------------------------

def series(text: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_random_paths_and_missing_keys_add_no_metric_series(
        make_door: Callable[..., Door]) -> None:
    """Pass-through used the raw path as its route label, a histogram per path, for 401s
    too: random paths grew /metrics without bound. Now refused requests (401, 404, 400)
    only count in one fixed-label counter, and pass-through is one route, ``passthrough``."""
    door = make_door()
    door.raw("POST", "/v1/moderations", body=b"{}")  # the pass-through's one series
    before = door.metrics()
    tokens = [secrets.token_hex(256) for _ in range(12)]
    for token in tokens:
        door.raw("GET", f"/v1/{token}", key=None)  # 401
        door.raw("POST", f"/v1/chat/{token}", key=None)  # 401
        door.raw("GET", f"/v1/{token}")  # 404, with a key
        door.raw("GET", f"/{token}/x")  # 404, no route
        door.raw("GET", f"/v1/{token}/../../..")  # 400
        door.raw("POST", f"/v1/moderations?{token}", body=b"{}")  # 200, forwarded
    after = door.metrics()
    assert series(after) == series(before)
    assert not any(token[:32] in after for token in tokens)
    assert abs(len(after) - len(before)) < 2048
    assert 'gateway_refused_requests_total{reason="unauthenticated"} 24.0' in after
    assert 'gateway_refused_requests_total{reason="not_found"} 24.0' in after
    assert 'gateway_requests_total{model="none",route="passthrough",status="200"} 13.0' in after


def test_an_upstreams_own_error_type_is_a_bounded_label(make_door: Callable[..., Door]) -> None:
    """An upstream's error ``type`` went into gateway_errors_total as it was: one series per
    value an upstream (or whoever controls it) chose. Unknown types count as ``other``."""
    door = make_door(upstream='forward_headers = ["x-rec-*"]'
                     if supports(UpstreamConfig, "forward_headers") else "",
                     policy=DEFAULT_POLICY.replace("max_attempts = 3", "max_attempts = 1"))
    weird = "t" + secrets.token_hex(8)
    status, _, _ = door.raw("POST", "/v1/chat/completions", body=orjson.dumps(
        {"model": "door-model", "messages": HELLO}),
        headers={"content-type": "application/json", "x-rec-error-type": weird})
    assert status >= 500
    text = door.metrics()
    assert weird not in text
    assert 'gateway_errors_total{route="/v1/chat/completions",type="other"} 1.0' in text


def test_metrics_behind_a_bearer_token(make_door: Callable[..., Door],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOOR_METRICS_TOKEN", "scrape-secret")
    door = make_door(server='metrics_key_env = "DOOR_METRICS_TOKEN"')
    assert httpx.get(door.url + "/metrics").status_code == 401
    assert httpx.get(door.url + "/metrics", headers={
        "authorization": "Bearer " + KEYS["team-a"]}).status_code == 401
    ok = httpx.get(door.url + "/metrics", headers={"authorization": "Bearer scrape-secret"})
    assert ok.status_code == 200 and "gateway_requests_total" in ok.text


def test_metrics_on_a_listener_of_their_own(make_door: Callable[..., Door]) -> None:
    port = free_port()
    door = make_door(server=f"metrics_port = {port}")
    assert door.raw("GET", "/metrics")[0] == 404
    assert door.raw("GET", "/metrics", key=None)[0] == 404
    own = f"http://127.0.0.1:{port}"
    ok = httpx.get(own + "/metrics")
    assert ok.status_code == 200 and "gateway_requests_total" in ok.text
    assert httpx.get(own + "/v1/moderations").status_code == 404
    assert httpx.post(own + "/metrics").status_code == 405


# --- finding 8: the headers an upstream is sent -----------------------------------------------

DROPPED = {"OpenAI-Organization": "org-victim", "OpenAI-Project": "proj-victim",
           "Cookie": "session=abc", "Forwarded": "for=10.0.0.1", "X-Forwarded-For": "10.0.0.1",
           "X-Forwarded-Host": "internal", "X-Real-IP": "10.0.0.1",
           "Idempotency-Key": "replay-me", "X-Custom-Thing": "x", "Via": "1.1 proxy",
           "Tracestate": "named-in-connection=1"}
KEPT = {"OpenAI-Beta": "assistants=v2", "Anthropic-Beta": "some-beta",
        "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/moderations"])
def test_client_headers_reach_the_upstream_only_from_the_allow_list(
        make_door: Callable[..., Door], target: str) -> None:
    """Billing (OpenAI-Organization, -Project: the gateway's key pays), cookies, forwarding,
    idempotency and headers the client's Connection names went upstream; now only the
    allow-list does, with the upstream's key."""
    door = make_door()
    status, _, _ = door.raw("POST", target, body=orjson.dumps(
        {"model": "door-model", "messages": HELLO}), headers={
            **DROPPED, **KEPT, "Content-Type": "application/json",
            "Connection": "keep-alive, Tracestate", "x-request-id": "req-door-1"})
    assert status == 200
    seen = door.rec.seen[-1].headers
    assert not {k.lower() for k in DROPPED} & set(seen), seen
    assert {k.lower(): v for k, v in KEPT.items()}.items() <= seen.items()
    assert seen["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert seen["content-type"] == "application/json"
    assert seen["x-request-id"] == "req-door-1"


def test_anthropic_betas_are_merged_and_a_key_is_held_to_its_own(
        make_door: Callable[..., Door], recorder: tuple[Recorder, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The configured betas and the client's reach an Anthropic upstream, with the client's
    ``anthropic-version`` and the upstream's key; a key whose ``betas`` are set sends only
    those (its others are removed)."""
    monkeypatch.setenv("DOOR_ANTHROPIC_KEY", "sk-ant-door")
    door = make_door(key_extra={"team-a": 'betas = ["a-beta"]'}, extra=f"""
[upstreams.claude]
type = "anthropic"
base_url = "{recorder[1]}"
api_key_env = "DOOR_ANTHROPIC_KEY"
beta = ["configured-beta"]

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]
""")
    body = orjson.dumps({"model": "claude", "max_tokens": 5, "messages": HELLO})
    for key, target, sent, expected in (
            ("team-a", "/v1/messages", "a-beta, other-beta", "configured-beta,a-beta"),
            ("team-a", "/v1/messages/count_tokens", "other-beta,a-beta",
             "configured-beta,a-beta"),
            ("team-b", "/v1/messages", "b-1,b-2", "configured-beta,b-1,b-2")):
        status, _, _ = door.raw("POST", target, key=key, body=body, headers={
            "anthropic-beta": sent, "anthropic-version": "2023-01-01",
            "content-type": "application/json", "openai-organization": "org-victim"})
        assert status == 200, target
        seen = door.rec.seen[-1].headers
        assert (seen["anthropic-beta"], seen["anthropic-version"]) == (expected, "2023-01-01")
        assert seen["x-api-key"] == "sk-ant-door" and "authorization" not in seen
        assert "openai-organization" not in seen


# --- finding 10: pass-through charged by tokens too -------------------------------------------

def test_pass_through_is_charged_tokens_as_well_as_requests(
        make_door: Callable[..., Door]) -> None:
    """Pass-through was charged one request and no tokens: a key's token limit did not cover
    it. Now its body's bytes / 4 are charged to the key's token bucket, the one its model
    requests share."""
    door = make_door(policy=DEFAULT_POLICY + "\n[rate_limits]\n"
                     "default = { tokens_per_minute = 1000 }\n")
    body = b"x" * 2400  # 600 tokens
    statuses = [door.raw("POST", "/v1/moderations", body=body)[0] for _ in range(2)]
    assert statuses == [200, 429]
    assert len(door.rec.seen) == 1
    assert door.chat("/v1/chat/completions", max_tokens=500)[0] == 429
