"""The fine pass's scoring call: token log-probabilities from the local engine.

The engine serves them as OpenAI's legacy completions do for a prompt echoed back
(``echo: true``, ``max_tokens: 0``, ``logprobs: 0``; :mod:`local_engine.scorer`), so any
OpenAI-compatible server that scores prompts this way (vLLM does) would serve as well. The
call goes through the :class:`~gateway.upstreams.base.Upstream` interface like any request;
texts are sent in as few calls as :data:`MAX_CALL_BYTES` allows (a byte-level tokenizer
gives at most a token a byte, and the engine takes 8,192 tokens a call), one after the
other, each within :data:`TIMEOUT_S`. Every failure (status, transport, a malformed answer,
the timeout) raises :class:`ScoringFailed`: the caller falls back to the coarse pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson

from gateway.compression.fine import Score, Scored
from gateway.errors import GatewayError
from gateway.upstreams.base import Upstream, UpstreamRequest

__all__ = ["MAX_CALL_BYTES", "TIMEOUT_S", "ScoringFailed", "engine_scorer", "parse"]

#: UTF-8 bytes of text per scoring call at most (a text longer than this goes alone).
MAX_CALL_BYTES = 8192
#: Seconds one scoring call may take before the fine pass gives up.
TIMEOUT_S = 30.0


class ScoringFailed(Exception):
    """The scorer did not answer with a log-probability for every token."""


def engine_scorer(upstream: Upstream, model: str, *, max_call_bytes: int = MAX_CALL_BYTES,
                  timeout_s: float = TIMEOUT_S) -> Score:
    """A :data:`~gateway.compression.fine.Score` calling ``upstream``'s ``/completions``
    with ``model``."""

    async def score(texts: list[str]) -> list[Scored]:
        out: list[Scored] = []
        for batch in _batches(texts, max_call_bytes):
            body = orjson.dumps({"model": model, "prompt": batch, "echo": True,
                                 "max_tokens": 0, "logprobs": 0})
            request = UpstreamRequest("POST", "/completions", body, ())
            try:
                reply = await asyncio.wait_for(upstream.send(request), timeout_s)
            except TimeoutError as exc:
                raise ScoringFailed(f"no answer within {timeout_s:g} s") from exc
            except (GatewayError, OSError) as exc:  # the upstream's transport errors
                raise ScoringFailed(f"{type(exc).__name__}: {exc}") from exc
            if reply.status != 200:
                raise ScoringFailed(f"the scorer answered {reply.status}: "
                                    f"{reply.body[:200]!r}")
            out += parse(reply.body, batch)
        return out

    return score


def _batches(texts: list[str], max_bytes: int) -> list[list[str]]:
    batches: list[list[str]] = []
    size = 0
    for text in texts:
        n = len(text.encode())
        if not batches or size + n > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(text)
        size += n
    return batches


def parse(body: bytes, texts: list[str]) -> list[Scored]:
    """A completions answer's per-prompt ``logprobs`` as :class:`Scored`, checked against
    ``texts``: one choice per text (by ``index``), offsets non-decreasing within the text,
    the first 0, a float or null per token. Raises ScoringFailed."""
    try:
        choices = orjson.loads(body)["choices"]
        found: dict[int, Any] = {int(c["index"]): c["logprobs"] for c in choices}
        out = [_scored(found[i], text) for i, text in enumerate(texts)]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ScoringFailed(f"a malformed scoring answer: {type(exc).__name__}: {exc}"
                            ) from exc
    if len(found) != len(texts):
        raise ScoringFailed(f"{len(found)} scored texts for {len(texts)} sent")
    return out


def _scored(logprobs: Any, text: str) -> Scored:
    offsets = np.asarray(logprobs["text_offset"], np.int64)
    values = np.array([np.nan if v is None else float(v) for v in logprobs["token_logprobs"]],
                      np.float64)
    if offsets.ndim != 1 or len(offsets) != len(values) or not len(offsets):
        raise ValueError("text_offset and token_logprobs differ in length or are empty")
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] > len(text):
        raise ValueError("text_offset is not a non-decreasing run of offsets into the text")
    return Scored(offsets, values)
