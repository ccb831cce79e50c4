"""The fine pass's scoring call through the Upstream interface: the legacy completions wire
format (echo, max_tokens 0, logprobs 0) in and out; anything else fails as ScoringFailed."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.compression.scoring import ScoringFailed, engine_scorer, parse
from gateway.errors import UpstreamUnreachable
from gateway.upstreams.base import Upstream, UpstreamRequest, UpstreamResponse, WholeResponse


def completion(prompts: list[str]) -> dict[str, Any]:
    """What the local engine answers: a token per character, the first unscored."""
    return {"object": "text_completion", "choices": [
        {"index": i, "text": p, "finish_reason": "length", "logprobs": {
            "tokens": list(p), "token_logprobs": [None] + [-1.5] * (len(p) - 1),
            "top_logprobs": None, "text_offset": list(range(len(p)))}}
        for i, p in enumerate(prompts)]}


class ScoringUpstream(Upstream):
    """A fake engine: answers ``/completions`` as the local engine does, or as told."""

    name = "engine"

    def __init__(self, answer: Any = None, status: int = 200, delay_s: float = 0.0) -> None:
        self.answer, self.status, self.delay_s = answer, status, delay_s
        self.bodies: list[dict[str, Any]] = []

    async def send(self, request: UpstreamRequest) -> WholeResponse:
        body = orjson.loads(request.body)
        self.bodies.append(body | {"path": request.path})
        await asyncio.sleep(self.delay_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        answer = self.answer if self.answer is not None else completion(body["prompt"])
        return WholeResponse(self.status, [], answer if isinstance(answer, bytes)
                     else orjson.dumps(answer))

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        raise UpstreamUnreachable("scoring only")

    async def aclose(self) -> None:
        pass


async def test_texts_are_scored_in_calls_of_bounded_size_in_order():
    upstream = ScoringUpstream()
    score = engine_scorer(upstream, "smollm2", max_call_bytes=10)
    texts = ["abcd", "efgh", "ijklmnopqrstu", "vw"]
    out = await score(texts)
    assert [b["prompt"] for b in upstream.bodies] == [["abcd", "efgh"], ["ijklmnopqrstu"],
                                                      ["vw"]]
    body = upstream.bodies[0]
    assert (body["path"], body["model"], body["echo"], body["max_tokens"], body["logprobs"]) \
        == ("/completions", "smollm2", True, 0, 0)
    for text, scored in zip(texts, out, strict=True):
        assert scored.offsets.tolist() == list(range(len(text)))
        assert np.isnan(scored.logprobs[0]) and (scored.logprobs[1:] == -1.5).all()


@pytest.mark.parametrize(("answer", "status", "match"), [
    (None, 503, "answered 503"),
    (b"not json", 200, "malformed"),
    ({"choices": []}, 200, "malformed"),
    ({"choices": [{"index": 0, "logprobs": None}]}, 200, "malformed"),
    ({"choices": [{"index": 0, "logprobs": {"text_offset": [0, 2, 1],
                                            "token_logprobs": [None, -1, -1]}}]}, 200,
     "non-decreasing"),
    ({"choices": [{"index": 0, "logprobs": {"text_offset": [0, 1],
                                            "token_logprobs": [None]}}]}, 200, "length"),
    (UpstreamUnreachable("connection refused"), 200, "connection refused"),
])
async def test_every_failure_is_a_scoring_failure(answer, status, match):
    score = engine_scorer(ScoringUpstream(answer, status), "smollm2")
    with pytest.raises(ScoringFailed, match=match):
        await score(["abc"])


async def test_a_slow_scorer_times_out():
    score = engine_scorer(ScoringUpstream(delay_s=5), "smollm2", timeout_s=0.05)
    with pytest.raises(ScoringFailed, match="no answer within"):
        await score(["abc"])


def test_a_text_past_its_end_is_refused():
    body = orjson.dumps(completion(["abcdef"]))
    with pytest.raises(ScoringFailed, match="non-decreasing"):
        parse(body, ["abc"])
