"""The workload bench's LiteLLM path (bench/litellm_proxy.py) in front of the project's fakes.

The config's shape is checked always; the proxy itself only where the pinned LiteLLM is
already installed (``python bench/litellm_proxy.py`` installs it: the suite never does). Its
start takes ~11 s and as many CPU seconds, paid once for the module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
import yaml

from bench.litellm_proxy import LiteLLMProxy, ModelRoute, config_yaml, installed
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_upstream import FakeUpstream, Record
from gateway.testing.server import ServerThread

# public names; "claude-sonnet-4-5" would do, but the anthropic SDK warns it is deprecated
GPT, CLAUDE = "gpt-4o", "claude-bench"
#: What each fake streams back (8 chunks by default).
ANSWER = {GPT: "w0 w1 w2 w3 w4 w5 w6 w7", CLAUDE: "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"}
EPHEMERAL = {"type": "ephemeral"}


def routes(openai_url: str, anthropic_url: str) -> list[ModelRoute]:
    return [ModelRoute(GPT, "openai", openai_url, "gpt-4o-upstream", "BENCH_UP_OPENAI_KEY"),
            ModelRoute(CLAUDE, "anthropic", anthropic_url, "claude-upstream", "BENCH_UP_ANT_KEY")]


def test_config_caches_responses_retries_and_marks_anthropic_prompts() -> None:
    config = yaml.safe_load(config_yaml(routes("http://up-openai", "http://up-anthropic/")))
    gpt, claude = config["model_list"]
    assert gpt == {"model_name": GPT, "litellm_params": {
        "model": "openai/gpt-4o-upstream", "api_base": "http://up-openai/v1",
        "api_key": "os.environ/BENCH_UP_OPENAI_KEY"}}
    assert claude["litellm_params"]["model"] == "anthropic/claude-upstream"
    assert claude["litellm_params"]["api_base"] == "http://up-anthropic"
    assert claude["litellm_params"]["cache_control_injection_points"] == [
        {"location": "message", "role": "system"}, {"location": "message", "index": -1}]
    assert config["litellm_settings"]["cache"] is True
    assert config["litellm_settings"]["cache_params"] == {"type": "local"}
    assert config["router_settings"] == {"num_retries": 2}
    assert config["general_settings"] == {"always_include_stream_usage": True}


def test_config_refuses_an_unknown_api() -> None:
    bad = ModelRoute("m", "gemini", "http://x", "m", "K")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="api must be"):
        config_yaml([bad])


needs_litellm = pytest.mark.skipif(
    not installed(), reason="LiteLLM not installed (python bench/litellm_proxy.py installs it)")


@dataclass
class Stack:
    proxy: LiteLLMProxy
    openai_up: FakeUpstream
    anthropic_up: FakeAnthropic

    def seen(self, upstream: FakeUpstream, marker: str) -> list[Record]:
        """The upstream's requests whose body carries ``marker``."""
        return [r for r in upstream.records if marker.encode() in r.body]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    openai_up, anthropic_up = FakeUpstream(), FakeAnthropic(api_key="sk-ant-bench-upstream")
    with ServerThread(openai_up) as o, ServerThread(anthropic_up) as a, LiteLLMProxy(
            routes(o.url, a.url), env={"BENCH_UP_OPENAI_KEY": "sk-bench-upstream",
                                       "BENCH_UP_ANT_KEY": "sk-ant-bench-upstream"}) as proxy:
        yield Stack(proxy, openai_up, anthropic_up)


def conversation(marker: str) -> Any:
    return [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": f"question {marker}"}]


def chat_stream(stack: Stack, model: str, marker: str) -> tuple[str, Any]:
    """Streams a chat completion through the proxy (the client asks no usage); the text and
    the last chunk's usage."""
    client = openai.OpenAI(base_url=stack.proxy.url + "/v1", api_key=stack.proxy.master_key)
    text, usage = "", None
    messages: Any = [{"role": "system", "content": "Be terse."}, *conversation(marker)]
    with client.chat.completions.create(model=model, stream=True, max_tokens=50, temperature=0,
                                        messages=messages) as stream:
        for chunk in stream:
            text += "".join(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
    return text, usage


def messages_stream(stack: Stack, model: str, marker: str) -> tuple[str, Any]:
    """Streams a Messages request through the proxy; the text and the final usage."""
    client = anthropic.Anthropic(base_url=stack.proxy.url, api_key=stack.proxy.master_key)
    with client.messages.stream(model=model, max_tokens=50, system="Be terse.",
                                messages=conversation(marker)) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message().usage


@needs_litellm
@pytest.mark.parametrize("model", [GPT, CLAUDE])
def test_chat_completion_streams_with_usage_through_litellm(stack: Stack, model: str) -> None:
    marker = uuid.uuid4().hex
    text, usage = chat_stream(stack, model, marker)
    assert text.split() == ANSWER[model].split()
    assert usage is not None and usage.completion_tokens == 8  # always_include_stream_usage
    upstream = stack.openai_up if model == GPT else stack.anthropic_up
    [seen] = stack.seen(upstream, marker)
    assert seen.path == ("/v1/chat/completions" if model == GPT else "/v1/messages")


@needs_litellm
@pytest.mark.parametrize("model", [GPT, CLAUDE])
def test_messages_stream_through_litellm(stack: Stack, model: str) -> None:
    marker = uuid.uuid4().hex
    text, usage = messages_stream(stack, model, marker)
    assert text.split() == ANSWER[model].split()
    assert usage.output_tokens == 8
    upstream = stack.openai_up if model == GPT else stack.anthropic_up
    [seen] = stack.seen(upstream, marker)
    # an OpenAI-format model gets chat completions (messages_via_chat), Claude its own API
    assert seen.path == ("/v1/chat/completions" if model == GPT else "/v1/messages")


def markers(body: dict[str, Any]) -> list[str]:
    """Where an Anthropic body carries cache_control: "system", or "message N"."""
    where = ["system" for block in body["system"] if "cache_control" in block]
    for i, message in enumerate(body["messages"]):
        blocks = message["content"] if isinstance(message["content"], list) else []
        where += [f"message {i}" for block in blocks if block.get("cache_control") == EPHEMERAL]
    return where


@needs_litellm
@pytest.mark.parametrize("send", [chat_stream, messages_stream], ids=["chat", "messages"])
def test_litellm_marks_the_system_and_last_message_for_claude(stack: Stack, send: Any) -> None:
    marker = uuid.uuid4().hex
    send(stack, CLAUDE, marker)
    [seen] = stack.seen(stack.anthropic_up, marker)
    assert markers(seen.json) == ["system", "message 2"]
    assert seen.json["system"][-1]["cache_control"] == EPHEMERAL


@needs_litellm
def test_litellm_answers_a_repeat_from_its_response_cache(stack: Stack) -> None:
    marker = uuid.uuid4().hex
    first, _ = messages_stream(stack, CLAUDE, marker)
    again, _ = messages_stream(stack, CLAUDE, marker)
    assert again == first
    assert len(stack.seen(stack.anthropic_up, marker)) == 1
    assert stack.proxy.cpu_seconds() > 0
