"""The engine's OpenAI server over real HTTP, with the official openai SDK as the client.

The model is the tiny random Llama; a character tokenizer stands in for a real one, so the
text a client sees is a function of the token ids the engine produced.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import openai
import pytest

from gateway.testing.server import ServerThread
from local_engine.async_engine import AsyncEngine
from local_engine.engine import Engine, Output
from local_engine.metrics import EngineMetrics
from local_engine.server import EngineServer, build_app


class CharTokenizer:
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool,
                            tokenize: bool, continue_final_message: bool = False) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        text += "" if continue_final_message else "<assistant>"
        return [2 + ord(c) % 94 for c in text]

    def __call__(self, text: str, add_special_tokens: bool,
                 return_offsets_mapping: bool) -> dict[str, list]:
        """One token per character, except that "é" is two (as a byte-level BPE may split
        a character): both start where it does."""
        ids, offsets = [], []
        for i, c in enumerate(text):
            for _ in range(2 if c == "é" else 1):
                ids.append(2 + ord(c) % 94)
                offsets.append((i, i + 1))
        return {"input_ids": ids, "offset_mapping": offsets}


class FakeEmbedder:
    """Deterministic unit vectors; records the size of every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        self.gate.wait(5)
        self.batches.append(len(texts))
        out = np.stack([np.random.default_rng(sum(map(ord, t))).normal(size=8) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


@dataclass
class Served:
    url: str
    engine: Engine
    aengine: AsyncEngine
    embedder: FakeEmbedder
    client: openai.OpenAI


@pytest.fixture
def served(make_engine: Callable[..., Engine]) -> Iterator[Served]:
    engine = make_engine(max_model_len=400)
    embedder = FakeEmbedder()
    metrics = EngineMetrics(engine)
    aengine = AsyncEngine(engine, embedder, metrics).start()
    server = EngineServer(aengine, "tiny",
                          CharTokenizer(), "fake-embed",
                          lambda texts: sum(len(t) for t in texts), default_max_tokens=16)
    with ServerThread(build_app(server, metrics)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        yield Served(srv.url, engine, aengine, embedder, client)
        client.close()


def ask(content: str = "hello there") -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_chat_completion_non_stream(served: Served) -> None:
    r = served.client.chat.completions.create(model="tiny", messages=ask(), max_tokens=7,
                                              temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny"
    choice = r.choices[0]
    assert choice.finish_reason == "length" and len(choice.message.content or "") == 7
    assert r.usage is not None
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens > 10
    assert served.engine.blocks.num_used == 0


def test_stream_matches_non_stream_and_reports_cached_tokens(served: Served) -> None:
    messages = ask("a question long enough to fill a few KV blocks of four tokens")
    whole = served.client.chat.completions.create(model="tiny", messages=messages,
                                                  max_tokens=9, temperature=0)
    stream = served.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=9, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 4  # prefix hit
    assert whole.usage is not None and whole.usage.prompt_tokens_details is not None
    assert whole.usage.prompt_tokens_details.cached_tokens == 0


def test_stop_string(served: Served) -> None:
    full = served.client.chat.completions.create(model="tiny", messages=ask(), max_tokens=10,
                                                 temperature=0).choices[0].message.content
    assert full is not None
    r = served.client.chat.completions.create(model="tiny", messages=ask(), max_tokens=10,
                                              temperature=0, stop=[full[4:6]])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == full[:full.index(full[4:6])]


@pytest.mark.parametrize(("kwargs", "param", "code"), [
    ({"messages": []}, "messages", "invalid_request"),
    ({"messages": ask("x" * 500)}, "messages", "context_length_exceeded"),
    ({"messages": ask(), "temperature": 3}, "temperature", "invalid_request"),
    ({"messages": ask(), "n": 2}, "n", "invalid_request"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role",
     "invalid_request"),
])
def test_bad_input_gets_openai_400(served: Served, kwargs: dict, param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        served.client.chat.completions.create(model="tiny", **kwargs)
    body = info.value.body
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error"
    assert body["param"] == param and body["code"] == code


def test_malformed_json_gets_400(served: Served) -> None:
    r = httpx.post(served.url + "/v1/chat/completions", content=b"{nope",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_client_disconnect_aborts_and_frees_blocks(served: Served) -> None:
    stream = served.client.chat.completions.create(model="tiny", messages=ask(),
                                                   max_tokens=300, temperature=0, stream=True)
    next(iter(stream))
    assert served.engine.blocks.num_used > 0
    stream.close()
    freed = _wait_until(lambda: served.engine.blocks.num_used == 0
                        and not served.engine.scheduler.has_work())
    assert freed, "the engine kept generating for a client that left"
    metrics = httpx.get(served.url + "/metrics").text
    assert "engine_requests_aborted_total 1.0" in metrics


def test_embeddings_float_and_base64_agree(served: Served) -> None:
    as_float = served.client.embeddings.create(model="fake-embed", input=["a", "bc"],
                                               encoding_format="float")
    default = served.client.embeddings.create(model="fake-embed", input=["a", "bc"])
    np.testing.assert_allclose([d.embedding for d in as_float.data],
                               [d.embedding for d in default.data], atol=1e-7)
    assert len(default.data) == 2 and len(default.data[0].embedding) == 8
    assert default.usage.prompt_tokens == 3


async def test_concurrent_embeddings_are_micro_batched(served: Served) -> None:
    served.embedder.gate.clear()  # hold the first batch so the others queue up behind it
    async with openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        first = asyncio.create_task(client.embeddings.create(model="fake-embed", input="0"))
        assert await asyncio.to_thread(_wait_until, served.embedder.entered.is_set)
        rest = [asyncio.create_task(client.embeddings.create(model="fake-embed",
                                                             input=f"text {i}"))
                for i in range(5)]
        assert await asyncio.to_thread(_wait_until, lambda: _inbox_size(served.aengine) == 5)
        served.embedder.gate.set()
        results = await asyncio.gather(first, *rest)
    assert all(len(r.data) == 1 for r in results)
    assert served.embedder.batches == [1, 5]


async def test_embeddings_nobody_waits_for_any_more_are_not_computed() -> None:
    """A caller that went away while its texts were queued (a shed request's cache lookup,
    a client that left) costs no embedding work."""
    embedder = FakeEmbedder()
    aengine = AsyncEngine(None, embedder).start()
    try:
        embedder.gate.clear()
        first = asyncio.create_task(aengine.embed(["held"]))
        assert await asyncio.to_thread(_wait_until, embedder.entered.is_set)
        gone = [asyncio.create_task(aengine.embed([f"gone {i}"])) for i in range(3)]
        kept = asyncio.create_task(aengine.embed(["kept"]))
        assert await asyncio.to_thread(_wait_until, lambda: _inbox_size(aengine) == 4)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        embedder.gate.set()
        assert (await first).shape == (1, 8) and (await kept).shape == (1, 8)
        assert embedder.batches == [1, 1]  # "held", then "kept" alone
    finally:
        aengine.close()


class SteppedEmbedder(FakeEmbedder):
    """Each call is counted in ``calls`` when it starts and waits for a ``permits``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = threading.Semaphore(0)
        self.permits = threading.Semaphore(0)

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.release()
        self.permits.acquire(timeout=5)
        return super().__call__(texts)


async def test_callers_gone_while_an_embedding_pass_runs_are_skipped_by_the_next() -> None:
    """One forward pass of at most max_embed_batch texts at a time, so a caller that leaves
    while an earlier pass runs (under a flood: a shed request) is not embedded for."""
    embedder = SteppedEmbedder()
    aengine = AsyncEngine(None, embedder, max_embed_batch=2).start()
    try:
        held = asyncio.create_task(aengine.embed(["held"]))
        assert await asyncio.to_thread(embedder.calls.acquire, True, 5)
        queued = [asyncio.create_task(aengine.embed([f"text {i}"])) for i in range(4)]
        assert await asyncio.to_thread(_wait_until, lambda: _inbox_size(aengine) == 4)
        embedder.permits.release()  # "held" ends; the next pass takes texts 0 and 1
        assert await asyncio.to_thread(embedder.calls.acquire, True, 5)
        queued[2].cancel()
        await asyncio.gather(queued[2], return_exceptions=True)
        embedder.permits.release(2)
        for task in (held, queued[0], queued[1], queued[3]):
            assert (await task).shape == (1, 8)
        assert embedder.batches == [1, 2, 1]  # text 2 was never embedded
    finally:
        embedder.permits.release(8)
        aengine.close()


class FailingEngine(Engine):
    """Runs its first step, then fails every later one, as a model error mid-stream would."""

    steps = 0

    def step(self) -> list[Output]:
        self.steps += 1
        if self.steps > 1:
            raise RuntimeError("device lost")
        return super().step()


def test_engine_failure_mid_stream_ends_with_an_error_event(
        make_engine: Callable[..., Engine]) -> None:
    made = make_engine()
    engine = FailingEngine(made.model, made.decode, made.config, tuple(made.eos))
    aengine = AsyncEngine(engine).start()
    server = EngineServer(aengine, "tiny", CharTokenizer(), None)
    with ServerThread(build_app(server)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(model="tiny", messages=ask(), max_tokens=50,
                                                temperature=0, stream=True)
        with pytest.raises(openai.APIError) as info:
            for _ in stream:
                pass
    assert info.value.body == {"message": "the local engine failed: device lost",
                               "type": "upstream_error", "param": None,
                               "code": "upstream_error"}
    assert _wait_until(lambda: engine.blocks.num_used == 0)


def test_models_lists_chat_and_embedding_models(served: Served) -> None:
    ids = [m.id for m in served.client.models.list()]
    assert ids == ["tiny", "fake-embed"]


def _inbox_size(aengine: AsyncEngine) -> int:
    """Submissions (requests, aborts, embedding jobs) the engine's thread has not taken yet."""
    return aengine._inbox.qsize()


def _wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Wait for a state another thread reaches (not a timing guess: returns at once when it
    holds, fails only after ``timeout`` s)."""
    tick = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return True
        tick.wait(0.005)
    return predicate()


def test_completions_score_prompt_tokens(served: Served) -> None:
    r = served.client.completions.create(model="tiny", prompt=["héllo", "ab"], echo=True,
                                         max_tokens=0, logprobs=0)
    assert [c.text for c in r.choices] == ["héllo", "ab"]
    first = r.choices[0].logprobs
    assert first is not None and first.token_logprobs is not None
    assert first.text_offset == [0, 1, 1, 2, 3, 4]
    assert first.tokens == ["h", "", "é", "l", "l", "o"]
    assert first.token_logprobs[0] is None
    assert all(v is not None and v < 0 for v in first.token_logprobs[1:])
    assert r.usage is not None and r.usage.prompt_tokens == 8
    assert r.usage.completion_tokens == 0
    # the same text alone scores the same: texts in one call do not see each other
    alone = served.client.completions.create(model="tiny", prompt="ab", echo=True,
                                             max_tokens=0, logprobs=0)
    assert alone.choices[0].logprobs == r.choices[1].logprobs


@pytest.mark.parametrize("kwargs, param", [
    ({"prompt": "hi", "max_tokens": 5}, "max_tokens"),
    ({"prompt": "hi", "echo": True, "max_tokens": 0, "logprobs": 3}, "logprobs"),
    ({"prompt": [], "echo": True, "max_tokens": 0}, "prompt"),
    ({"prompt": "x" * 600, "echo": True, "max_tokens": 0, "logprobs": 0}, "prompt"),
])
def test_completions_refuse_generation_and_bad_input(served: Served, kwargs: dict,
                                                     param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        served.client.completions.create(model="tiny", **kwargs)
    assert err.value.status_code == 400
    assert isinstance(err.value.body, dict) and err.value.body.get("param") == param


def test_without_grammars_structured_output_is_a_400_that_says_why(
        make_engine: Callable[..., Engine]) -> None:
    aengine = AsyncEngine(make_engine()).start()
    server = EngineServer(aengine, "tiny", CharTokenizer(), None,
                          no_grammars="the tokenizer is misread")
    with ServerThread(build_app(server)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", messages=ask(), max_tokens=5,
                                           response_format={"type": "json_object"})
        assert client.chat.completions.create(model="tiny", messages=ask(), max_tokens=5
                                              ).choices[0].message.content  # free text works
    assert info.value.body == {
        "message": "this engine cannot constrain its output (the tokenizer is misread)",
        "type": "invalid_request_error", "param": "response_format",
        "code": "invalid_request"}
    aengine.close()


def test_a_final_assistant_message_is_continued_with_continue_final_message(
        served: Served) -> None:
    """vLLM's and SGLang's ``continue_final_message``: the prompt ends with the assistant's
    text itself (no new turn after it), so the answer goes on with it."""
    said = [*ask("hi"), {"role": "assistant", "content": "ab"}]
    anew = served.client.chat.completions.create(model="tiny", messages=said, max_tokens=1)
    going = served.client.chat.completions.create(
        model="tiny", messages=said, max_tokens=1,
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert anew.usage is not None and going.usage is not None
    assert going.usage.prompt_tokens == len("<user>hi<assistant>ab")
    assert anew.usage.prompt_tokens == len("<user>hi<assistant>ab<assistant>")
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        served.client.chat.completions.create(
            model="tiny", messages=ask("hi"), max_tokens=1,
            extra_body={"continue_final_message": True, "add_generation_prompt": False})
