"""Issue 45, finding 9 (and finding 10's count_tokens): bodies that crashed the gateway's
translations with an unhandled error (a 500 "internal gateway error") get a 400 in the
caller's API format naming the field, over real HTTP; count_tokens counts a huge text in
bounded time without stalling the gateway, and is rate limited like a model request.

Each crash site the review's fuzz found is one case here (the fuzz itself, over every
direction: tests/gateway/equivalence/test_fuzz.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.server import ServerThread
from tests.conftest import DEFAULT_POLICY, FakeServer, GatewayServer, LogSink, gateway_toml

HI = [{"role": "user", "content": "hi"}]
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def post(gw: GatewayServer, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(gw.v1 + path, content=orjson.dumps(body), timeout=30,
                      headers={"content-type": "application/json", **headers})


def anthropic_error(r: httpx.Response, status: int, param: str) -> str:
    """The message of an Anthropic-shaped error naming ``param``."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    message: str = body["error"]["message"]
    assert param in message, message
    return message


def openai_error(r: httpx.Response, status: int, param: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return error


# -- Anthropic clients of an OpenAI-compatible model (anthropic_to_openai) -------------------

@pytest.mark.parametrize(("content", "param"), [
    # _user: a tool_result without its tool_use_id, a text block without text
    ([{"type": "tool_result", "content": "42"}], "messages[0].content[0].tool_use_id"),
    ([{"type": "text"}], "messages[0].content[0].text"),
    # _tool_result_text: a block that is not an object, a text block without text
    ([{"type": "tool_result", "tool_use_id": "t1", "content": [7]}],
     "messages[0].content[0].content[0]"),
    ([{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text"}]}],
     "messages[0].content[0].content[0].text"),
    # _image_url and _document: a source without its data
    ([{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}],
     "messages[0].content[0].source.data"),
    ([{"type": "document", "source": {"type": "content"}}],
     "messages[0].content[0].source.content"),
])
def test_an_anthropic_client_of_an_openai_model_gets_a_400_naming_the_block(
        gw: GatewayServer, fake: FakeUpstream, content: list[Any], param: str) -> None:
    r = post(gw, "/messages", {"model": "fake-model", "max_tokens": 8,
                               "messages": [{"role": "user", "content": content}]}, **ANTHROPIC)
    anthropic_error(r, 400, param)
    assert not fake.records


def test_an_anthropic_tool_without_a_name_is_a_400_naming_it(gw: GatewayServer,
                                                             fake: FakeUpstream) -> None:
    # _tool
    r = post(gw, "/messages", {"model": "fake-model", "max_tokens": 8, "messages": HI,
                               "tools": [{"input_schema": {"type": "object"}}]}, **ANTHROPIC)
    anthropic_error(r, 400, "tools[0].name")


def test_thinking_that_is_not_an_object_is_a_400(gw: GatewayServer, fake: FakeUpstream) -> None:
    r = post(gw, "/messages", {"model": "fake-model", "max_tokens": 8, "messages": HI,
                               "thinking": ["enabled"]}, **ANTHROPIC)
    anthropic_error(r, 400, "thinking")


# -- OpenAI clients of an Anthropic model (openai_to_anthropic) ------------------------------

@pytest.mark.parametrize(("fields", "param"), [
    # _tool: not an object, no function, a function without a name
    ({"tools": ["weather"]}, "tools[0]"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]},
     "tools[0].function.name"),
    ({"tools": 7}, "tools"),
    # a tool call without its function, content parts that are not objects
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function"}]}, {"role": "user", "content": "go on"}]},
     "messages[1].tool_calls[0].function"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": 5}]}]},
     "messages[0].content[0].image_url"),
])
def test_an_openai_client_of_an_anthropic_model_gets_a_400_naming_the_field(
        with_claude: tuple[GatewayServer, FakeAnthropic], fields: dict[str, Any],
        param: str) -> None:
    gw, claude = with_claude
    r = post(gw, "/chat/completions", {"model": "claude", "messages": HI, **fields})
    openai_error(r, 400, param)
    assert not claude.records


# -- Responses clients -----------------------------------------------------------------------

@pytest.mark.parametrize(("item", "param"), [
    # _check_item: a type or a role that is not a string (a TypeError looking it up)
    ({"type": {"a": 1}, "role": "user", "content": "hi"}, "input[0].type"),
    ({"role": ["user"], "content": "hi"}, "input[0].role"),
    ({"role": {}, "content": "hi"}, "input[0].role"),
])
def test_a_responses_item_of_the_wrong_shape_is_a_400(gw: GatewayServer, fake: FakeUpstream,
                                                      item: dict[str, Any], param: str) -> None:
    r = post(gw, "/responses", {"model": "fake-model", "input": [item]})
    openai_error(r, 400, param)


def test_a_responses_text_part_that_is_not_a_string_is_a_400(gw: GatewayServer,
                                                             fake: FakeUpstream) -> None:
    # _content: joining the parts' texts
    r = post(gw, "/responses", {"model": "fake-model", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": None}]}]})
    openai_error(r, 400, "input[0].content[0].text")
    assert not fake.records


def test_a_responses_temperature_that_is_not_a_number_reaches_no_cache_error(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    # cache/keys.py ineligible_reason compared it with a number
    gw = make_gateway('\n[cache]\nenabled = true\nbackend = "memory"\n',
                      policy=DEFAULT_POLICY + "\n[cache]\nenabled = true\nsemantic = false\n")
    r = post(gw, "/responses", {"model": "fake-model", "input": "hi",
                                "temperature": {"x": 1}})
    assert r.status_code < 500, r.text  # not the gateway's to refuse: the upstream's word
    assert fake.records[0].json["temperature"] == {"x": 1}


# -- count_tokens ----------------------------------------------------------------------------

@pytest.fixture
def big_gateway(tmp_path: Path, fake_server: FakeServer) -> Iterator[GatewayServer]:
    """A gateway taking bodies of up to 16 MiB."""
    (tmp_path / "policy.toml").write_text(DEFAULT_POLICY)
    config = tmp_path / "gateway.toml"
    config.write_text(gateway_toml(fake_server.url).replace("max_body_bytes = 65536",
                                                            "max_body_bytes = 16777216"))
    sink = LogSink()
    app = create_app(load_config(config), request_sink=sink, watch_policy=False)
    with ServerThread(app) as srv:
        yield GatewayServer(srv.url, app.gateway, tmp_path / "policy.toml", sink, srv)


@pytest.mark.parametrize(("text", "least"), [
    ("x" * 7_000_000, 7_000_000 // 8),  # 7 MB: bpe-openai refuses 1M characters a call
    ("a " * 450_000, 400_000),  # < 1 MB, but over its 200,000 tokens a call
])
def test_count_tokens_counts_a_huge_text_in_bounded_time_without_stalling(
        big_gateway: GatewayServer, text: str, least: int) -> None:
    gw = big_gateway
    body = orjson.dumps({"model": "fake-model", "messages": [{"role": "user",
                                                               "content": text}]})
    stalls: list[float] = []
    done = threading.Event()

    def probe() -> None:  # the gateway keeps answering while it counts
        with httpx.Client() as client:
            while not done.is_set():
                started = time.perf_counter()
                assert client.get(gw.url + "/healthz").status_code == 200
                stalls.append(time.perf_counter() - started)

    prober = threading.Thread(target=probe)
    started = time.perf_counter()
    prober.start()
    try:
        r = httpx.post(gw.v1 + "/messages/count_tokens", content=body, timeout=60,
                       headers={"content-type": "application/json", **ANTHROPIC})
    finally:
        done.set()
        prober.join()
    elapsed = time.perf_counter() - started
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-token-count"] == "estimate"
    assert r.json()["input_tokens"] >= least
    assert elapsed < 10, elapsed  # ~0.3 s measured on a loaded 2-core machine
    assert max(stalls) < 2, max(stalls)


def test_count_tokens_with_tools_that_are_not_an_array_is_estimated(gw: GatewayServer) -> None:
    r = post(gw, "/messages/count_tokens", {"model": "fake-model", "messages": HI,
                                            "tools": True}, **ANTHROPIC)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 0


def test_count_tokens_is_rate_limited_with_the_keys_model_requests(
        make_gateway: Callable[..., GatewayServer], fake: FakeUpstream) -> None:
    gw = make_gateway(policy=DEFAULT_POLICY + "\n[rate_limits]\n"
                             "default = { requests_per_minute = 3 }\n")
    count = {"model": "fake-model", "messages": HI}
    first = post(gw, "/messages/count_tokens", count, **ANTHROPIC)
    assert first.status_code == 200, first.text
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert first.headers["anthropic-ratelimit-requests-remaining"] == "2"
    assert post(gw, "/messages", {**count, "max_tokens": 8}, **ANTHROPIC).status_code == 200
    assert post(gw, "/messages/count_tokens", count, **ANTHROPIC).status_code == 200
    refused = post(gw, "/messages/count_tokens", count, **ANTHROPIC)
    assert refused.status_code == 429, refused.text
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # and the key's model requests wait as well
    assert post(gw, "/messages", {**count, "max_tokens": 8}, **ANTHROPIC).status_code == 429


@pytest.mark.parametrize(("cache", "where"), [(False, "tool"), (True, "schema")])
def test_a_schema_nested_to_the_doors_limit_is_never_a_500_once_translated(
        make_gateway: Callable[..., GatewayServer], cache: bool, where: str) -> None:
    """The door takes a body nested up to 254 levels; its translation (an Anthropic tool's
    ``input_schema`` becomes OpenAI's ``tools[].function.parameters``, one level deeper) and
    the cache's keys (found by ``make fuzz``, on ``output_config.format.schema``) may go past
    what orjson writes: the cache is bypassed, and what cannot be sent is refused with a
    400, never a 500."""
    gw = make_gateway('[cache]\nenabled = true\nbackend = "memory"\nsemantic = false\n'
                      if cache else "", policy=DEFAULT_POLICY + ("\n[cache]\nenabled = true\n"
                                                                  if cache else ""))
    statuses = set()
    for depth in range(244, 256):
        schema: Any = "deep"
        for _ in range(depth):
            schema = [schema]
        body: dict[str, Any] = {"model": "fake-model", "max_tokens": 8, "messages": HI}
        if where == "tool":
            body["tools"] = [{"name": "t", "input_schema": {"type": "object", "x": schema}}]
        else:
            body["output_config"] = {"format": {"type": "json_schema", "schema": {"x": schema}}}
        r = httpx.post(gw.v1 + "/messages", content=json.dumps(body), timeout=30,
                       headers={"content-type": "application/json", **ANTHROPIC})
        assert r.status_code < 500, r.text
        statuses.add(r.status_code)
    assert 400 in statuses
