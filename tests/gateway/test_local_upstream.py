"""``type = "local"``: the gateway starts the engine as a child process, routes to it, and
stops it. The engine runs a tiny random Llama with SmolLM2's tokenizer (quick to load)."""

from __future__ import annotations

import time
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.testing.server import ServerThread
from gateway.upstreams.local import LocalUpstream
from tests.conftest import LogSink
from tests.gateway.test_compress_stage import PROMPT


def write_config(tmp_path: Path, model_dir: Path) -> Path:
    (tmp_path / "policy.toml").write_text('version = "t"\n')
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
[server]
policy = "policy.toml"
policy_reload = false

[logging]
requests = false

[upstreams.engine]
type = "local"

[upstreams.engine.engine]
model = "{model_dir}"
embeddings = false
kv_cache_mb = 16
max_model_len = 512
default_max_tokens = 8
dtype = "float32"
speculative = {{ method = "ngram", num_tokens = 3, max_batch_size = 4 }}

[models.tiny]
targets = [{{ upstream = "engine", model = "tiny" }}]
""")
    return path


def test_gateway_starts_routes_to_and_stops_the_engine(tmp_path: Path,
                                                       tiny_model_dir: Path) -> None:
    app = create_app(load_config(write_config(tmp_path, tiny_model_dir)))
    upstream = app.gateway.upstreams["engine"]
    assert isinstance(upstream, LocalUpstream)
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": "hello"}], max_tokens=5, temperature=0)
        assert r.usage is not None and r.usage.completion_tokens <= 5
        assert r.choices[0].finish_reason in ("length", "stop")
        # Admitted to match the batch the engine measured worth running at once.
        health = httpx.get(f"http://127.0.0.1:{upstream.port}/healthz").json()
        assert health["status"] == "ok" and 1 <= health["capacity"] <= 32
        assert health["dtype"] == "float32"  # as configured
        assert upstream.capacity == health["capacity"]
        limiter = app.gateway.dispatcher.guards["engine"].limiter
        # (the limit itself adapts to latency from there: a slow step on a busy machine
        # may already have lowered it)
        assert limiter.policy.max_limit == health["capacity"]
        assert 0 < limiter.limit <= limiter.policy.max_limit
        stream = client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": "hello"}], max_tokens=5, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == r.choices[0].message.content
        # An Anthropic client reaches the engine too (translated both ways), streamed or not.
        claude = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)
        m = claude.messages.create(model="tiny", max_tokens=5, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": "hello"}])
        assert m.content[0].text == r.choices[0].message.content
        assert m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens <= 5
        with claude.messages.stream(model="tiny", max_tokens=5, extra_body={"temperature": 0},
                                    messages=[{"role": "user", "content": "hello"}]) as events:
            assert "".join(events.text_stream) == m.content[0].text
            assert events.get_final_message().usage.output_tokens == m.usage.output_tokens
        # A Responses client too (translated to chat and back), whole and streamed.
        resp = client.responses.create(model="tiny", input="hello", max_output_tokens=5,
                                       temperature=0)
        assert resp.output_text == r.choices[0].message.content
        assert resp.status in ("completed", "incomplete")
        streamed = list(client.responses.create(model="tiny", input="hello", stream=True,
                                                max_output_tokens=5, temperature=0))
        assert streamed[0].type == "response.created"
        last = streamed[-1]  # incomplete when the 5 tokens ran out (no stop token)
        assert last.type in ("response.completed", "response.incomplete")
        assert last.response.status == resp.status
        assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") \
            == resp.output_text
        # One scrape target: the engine's own metrics, labelled with its upstream.
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'engine_requests_finished_total{reason="length",upstream="engine"}' in metrics \
            or 'engine_requests_finished_total{reason="stop",upstream="engine"}' in metrics
        assert 'engine_ttft_ms_count{upstream="engine"}' in metrics
        assert 'engine_spec_acceptance_length{upstream="engine"}' in metrics
        assert 'gateway_engine_scrape_errors_total{upstream="engine"} 0.0' in metrics
        assert "gateway_requests_total" in metrics
        process = upstream._process
        assert process is not None and process.returncode is None
        assert upstream.ready
        client.close()
        claude.close()
    assert process.returncode is not None  # stopped with the gateway


def test_local_upstream_config_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[upstreams.e]\ntype = "local"\nbase_url = "http://x"\n')
    with pytest.raises(ConfigError, match="takes no base_url"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\nmax_num_seqs = 64\n'
                    'max_batch_tokens = 32\n')
    with pytest.raises(ConfigError, match="max_batch_tokens"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\nmodle = "x"\n')
    with pytest.raises(ConfigError, match="modle"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\n'
                    'speculative = { method = "ngram", tokens = 4 }\n')
    with pytest.raises(ConfigError, match="speculative.tokens"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\n'
                    'speculative = { method = "off" }\n')
    assert "off" in LocalUpstream("e", load_config(path).upstreams["e"]).command()
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\n'
                    'speculative = { method = "eagle" }\n')
    with pytest.raises(ConfigError, match="speculative.method"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\ndtype = "float16"\n')
    with pytest.raises(ConfigError, match="dtype"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\ndtype = "float32"\n')
    command = LocalUpstream("e", load_config(path).upstreams["e"]).command()
    assert command[command.index("--dtype") + 1] == "float32"
    assert command[command.index("--quantization") + 1] == "none"  # the defaults
    assert command[command.index("--kv-cache-dtype") + 1] == "auto"
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\nquantization = "int4"\n')
    with pytest.raises(ConfigError, match="quantization"):
        load_config(path)
    path.write_text('[upstreams.e]\ntype = "local"\n[upstreams.e.engine]\n'
                    'quantization = "int8"\nkv_cache_dtype = "fp8"\n')
    command = LocalUpstream("e", load_config(path).upstreams["e"]).command()
    assert command[command.index("--quantization") + 1] == "int8"
    assert command[command.index("--kv-cache-dtype") + 1] == "fp8"


def test_an_engine_that_dies_is_restarted_and_the_request_waits_for_it(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    app = create_app(load_config(write_config(tmp_path, tiny_model_dir)))
    upstream = app.gateway.upstreams["engine"]
    assert isinstance(upstream, LocalUpstream)
    messages = [{"role": "user", "content": "hello"}]
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5,
                                               temperature=0)
        crashed = upstream._process
        assert crashed is not None
        crashed.kill()  # as the OOM killer would
        # the pooled connection finds the engine dead: the gateway restarts it, waits, and
        # sends the request again
        again = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5,
                                               temperature=0)
        assert again.choices[0].message.content == first.choices[0].message.content
        assert crashed.returncode is not None
        assert upstream._process is not crashed and upstream.ready
        client.close()


def test_an_engine_that_cannot_start_fails_requests_with_its_exit_status(
        tmp_path: Path) -> None:
    app = create_app(load_config(write_config(tmp_path, tmp_path / "no-such-model")))
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="tiny", messages=[
                {"role": "user", "content": "hello"}], max_tokens=5)
        assert info.value.status_code == 502
        body = info.value.body
        assert isinstance(body, dict) and body["code"] == "upstream_unreachable"
        assert "exited with status" in body["message"]
        client.close()


async def _no_embedding(texts: list[str]) -> np.ndarray:
    return np.ones((len(texts), 4), np.float32) / 2  # every unit alike: BM25 decides


def test_token_level_compression_is_scored_by_the_engine(tmp_path: Path,
                                                         tiny_model_dir: Path) -> None:
    config = write_config(tmp_path, tiny_model_dir)
    config.write_text(config.read_text().replace("max_model_len = 512", "max_model_len = 1024"))
    (tmp_path / "policy.toml").write_text('version = "t"\n[compression]\nenabled = true\n'
                                          'gate = "always"\nmin_tokens = 200\n'
                                          'token_level = true\n')
    sink = LogSink()
    app = create_app(load_config(config), request_sink=sink, embed=_no_embedding)
    upstream = app.gateway.upstreams["engine"]
    with ServerThread(app) as srv:
        deadline = time.monotonic() + 120
        while not upstream.ready:  # a request while it loads is compressed coarse alone
            assert time.monotonic() < deadline
            time.sleep(0.1)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=2)
        assert raw.parse().choices[0].finish_reason in ("length", "stop")
        client.close()
    [record] = sink.wait(1)
    assert record["compress_fine"] == "applied" and record["compress_skip"] is None
    assert record["compression"] >= 3.9 and float(raw.headers["x-gateway-compression"]) >= 3.9
    # the engine's own count of what it read: the compressed prompt and the chat template
    assert record["prompt_tokens"] <= record["tokens_after"] + 40
