"""A chat completion's answer from the engine's outputs: collected whole, or streamed as
OpenAI's SSE chunks (role, content or tool-call argument deltas, the finish chunk, usage
when asked, ``[DONE]``)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator

from llm_wire.sse import DONE, json_event
from local_engine.engine import Output
from local_engine.errors import GenerationFailed
from local_engine.openai_format import ChatRequest, chat_chunk, usage
from local_engine.tool_calls import CallParser

__all__ = ["collect", "stream"]


async def collect(first: Output, outputs: AsyncIterator[Output]) -> Output:
    last = first
    while not last.finished:
        last = await anext(outputs)
    return last


async def stream(chat: ChatRequest, id_: str, prompt_len: int, first: Output,
                 outputs: AsyncGenerator[Output, None]) -> AsyncIterator[bytes]:
    """SSE chunks: role, content deltas, the finish chunk, usage (when asked), [DONE].
    Starlette cancels this generator when the client disconnects; closing ``outputs``
    then aborts the request."""
    created = int(time.time())
    model = chat.model
    parser = CallParser() if chat.structured.calls else None
    try:
        yield chat_chunk(id_, model, created, {"role": "assistant", "content": ""})
        out = first
        while True:
            if parser is not None:
                deltas = parser.feed(out.text) + (parser.close() if out.finished else [])
                for delta in deltas:
                    yield chat_chunk(id_, model, created, delta)
            elif out.text:
                yield chat_chunk(id_, model, created, {"content": out.text})
            if out.finished:
                break
            try:
                out = await anext(outputs)
            except Exception as exc:  # noqa: BLE001 - the engine failed mid-stream: say so, end
                err = GenerationFailed(f"the local engine failed: {exc}")
                yield json_event({"error": err.as_dict()})
                return
        seq = out.seq
        reason = seq.finish_reason or "stop"
        if parser is not None and parser.calls and reason == "stop":
            reason = "tool_calls"
        yield chat_chunk(id_, model, created, {}, reason)
        if chat.include_usage:
            yield chat_chunk(id_, model, created, None,
                             usage_=usage(prompt_len, len(seq.output_ids), seq.num_cached))
        yield DONE
    finally:
        await outputs.aclose()
