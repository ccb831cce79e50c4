"""``gateway replay FILE``: replay recorded conversations against an OpenAI-compatible endpoint
and report latency (TTFT, TPOT, end-to-end) and throughput.

FILE is JSONL, one conversation a line, in one of three shapes:

- ``{"turns": ["q1", "q2", ...]}`` (MT-Bench): each turn is a user message sent after the
  previous turn's streamed answer was appended as the assistant message;
- ``{"prompt": "..."}``: one user turn;
- ``{"messages": [...]}``: OpenAI chat messages, sent as one request; with ``--per-turn``,
  one request per assistant message of the recording, with the recorded history before it
  (its tool calls and tool results included; the replayed answers are not fed back), as an
  agent trace is replayed (../shared/data/agent_traces).

``--tools FILE`` (a JSON array of OpenAI tool definitions) sends those tools with every
request (``tool_choice`` auto), so a traced agent's requests are replayed whole.

Every request streams (``stream_options.include_usage``) so TTFT is the time to the first
content or tool-call delta. A failed request is counted and recorded (exception type and message) and
ends its conversation (later turns need its answer); the other conversations go on.
Prompt and completion text are never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # the SDK loads only when a replay runs
    from openai import AsyncOpenAI

__all__ = ["ReplayReport", "RequestResult", "add_arguments", "load_conversations", "replay",
           "run"]

#: One conversation: for each request, the messages appended to the history before sending it.
Conversation = list[list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """One request. Times in ms; ``ttft_ms``/``tpot_ms`` are None when not measurable (no
    content, or at most one token); ``error`` is ``"TypeName: message"`` or None."""

    conversation: int
    turn: int
    latency_ms: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """All requests of a replay; ``wall_s`` is the whole run in seconds."""

    results: list[RequestResult]
    conversations: int
    wall_s: float

    def summary(self) -> dict[str, Any]:
        """The figures printed by the CLI: counts, output tokens, ``wall_s``,
        ``output_tokens_per_s`` and ``{ttft,tpot,e2e}_ms`` -> ``{p50,p95,p99}`` (ms, over
        successful requests; None when there are none). ``error_types``: type -> count."""
        ok = [r for r in self.results if r.error is None]
        tokens = sum(r.completion_tokens for r in ok)
        errors = Counter(r.error.split(":", 1)[0] for r in self.results if r.error)

        def pcts(values: list[float | None]) -> dict[str, float | None]:
            xs = sorted(v for v in values if v is not None)
            return {f"p{p}": _nearest_rank(xs, p) for p in (50, 95, 99)}

        return {
            "requests": len(self.results),
            "conversations": self.conversations,
            "errors": len(self.results) - len(ok),
            "output_tokens": tokens,
            "wall_s": round(self.wall_s, 3),
            "output_tokens_per_s": round(tokens / self.wall_s, 1) if self.wall_s > 0 else 0.0,
            "ttft_ms": pcts([r.ttft_ms for r in ok]),
            "tpot_ms": pcts([r.tpot_ms for r in ok]),
            "e2e_ms": pcts([r.latency_ms for r in ok]),
            "error_types": dict(errors),
        }


def _nearest_rank(sorted_xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least p% of values <= it)."""
    if not sorted_xs:
        return None
    return round(sorted_xs[max(0, math.ceil(p / 100 * len(sorted_xs)) - 1)], 2)


def _per_turn(messages: list[dict[str, Any]]) -> Conversation:
    """One request per assistant message: each gets the messages since the previous one
    (that recorded assistant message first)."""
    turns: Conversation = []
    start = 0
    for i, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "assistant" and i > start:
            turns.append(messages[start:i])
            start = i
    return turns


def load_conversations(path: Path, limit: int | None = None,
                       per_turn: bool = False) -> list[Conversation]:
    """Parse FILE (see the module doc). Raises ValueError naming the file and line."""
    out: list[Conversation] = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from exc
            if isinstance(obj, dict) and isinstance(obj.get("turns"), list) and obj["turns"]:
                out.append([[{"role": "user", "content": str(t)}] for t in obj["turns"]])
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                out.append([[{"role": "user", "content": obj["prompt"]}]])
            elif isinstance(obj, dict) and isinstance(obj.get("messages"), list) and obj["messages"]:
                turns = _per_turn(list(obj["messages"])) if per_turn else []
                out.append(turns or [list(obj["messages"])])
            else:
                raise ValueError(f"{path}:{lineno}: expected a non-empty 'turns' list, a "
                                 "'prompt' string or a non-empty 'messages' list")
    return out


async def _one(client: AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int,
               conv: int, turn: int, tools: list[dict[str, Any]] | None = None
               ) -> tuple[RequestResult, str]:
    """Stream one request; returns its result and the answer text (for the next turn)."""
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    parts: list[str] = []
    try:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model=model, messages=messages, max_tokens=max_tokens,
            stream=True, stream_options={"include_usage": True}, **extra)
        async with stream:  # closes the connection when the stream fails half-way
            async for chunk in stream:
                if chunk.usage is not None:
                    usage_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    if choice.delta.tool_calls and first is None:
                        first = time.perf_counter()
                    if choice.delta.content:
                        if first is None:
                            first = time.perf_counter()
                        chunks += 1
                        parts.append(choice.delta.content)
    except Exception as exc:  # noqa: BLE001 - a failure is a data point, not a reason to stop
        elapsed = (time.perf_counter() - start) * 1000
        return RequestResult(conv, turn, elapsed, error=f"{type(exc).__name__}: {exc}"[:300]), ""
    end = time.perf_counter()
    tokens = usage_tokens if usage_tokens is not None else chunks
    ttft = (first - start) * 1000 if first is not None else None
    tpot = (end - first) * 1000 / (tokens - 1) if first is not None and tokens > 1 else None
    return RequestResult(conv, turn, (end - start) * 1000, ttft, tpot, tokens), "".join(parts)


async def replay(
    conversations: Iterable[Conversation],
    *,
    client: AsyncOpenAI,
    model: str,
    concurrency: int,
    max_tokens: int,
    progress: Callable[[int], None] | None = None,
    tools: list[dict[str, Any]] | None = None,
    recorded: bool = False,
) -> ReplayReport:
    """Replay ``conversations`` with at most ``concurrency`` in flight (one worker task each);
    turns within a conversation run in order. ``progress(n)`` is called as n requests are
    done (or skipped after an error). ``tools`` go with every request; ``recorded``: the
    turns carry the recorded answers (``--per-turn``), so the replayed ones are not
    appended. Never raises for a failed request."""
    convs = list(conversations)
    results: list[RequestResult] = []
    todo = iter(enumerate(convs))  # shared by the workers; next() never awaits, so it is safe

    async def worker() -> None:
        for idx, conv in todo:
            history: list[dict[str, Any]] = []
            for turn, new_messages in enumerate(conv):
                history.extend(new_messages)
                result, answer = await _one(client, model, history, max_tokens, idx, turn,
                                            tools)
                results.append(result)
                if result.error is not None:
                    if progress:
                        progress(len(conv) - turn)
                    break
                if not recorded:
                    history.append({"role": "assistant", "content": answer})
                if progress:
                    progress(1)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(convs))))))
    return ReplayReport(results, len(convs), time.perf_counter() - start)


def _print_table(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    table = Table(title="replay", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("requests", "conversations", "errors", "output_tokens"):
        table.add_row(key.replace("_", " "), str(s[key]))
    table.add_row("wall time (s)", f"{s['wall_s']:.2f}")
    table.add_row("output tokens/s", f"{s['output_tokens_per_s']:.1f}")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end")):
        p = s[key]
        table.add_row(f"{label} p50 / p95 / p99 (ms)",
                      f"{ms(p['p50'])} / {ms(p['p95'])} / {ms(p['p99'])}")
    for name, count in sorted(s["error_types"].items()):
        table.add_row(f"  error: {name}", str(count), style="red")
    Console().print(table)


async def _main(args: argparse.Namespace, conversations: list[Conversation],
                tools: list[dict[str, Any]] | None) -> ReplayReport:
    # No SDK retries: a retried request would hide the failure and inflate its latency.
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0) as client:

        async def go(progress: Callable[[int], None] | None = None) -> ReplayReport:
            return await replay(conversations, client=client, model=args.model,
                                concurrency=args.concurrency, max_tokens=args.max_tokens,
                                progress=progress, tools=tools, recorded=args.per_turn)

        if args.json:
            return await go()
        from rich.console import Console
        from rich.progress import Progress

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("replay", total=sum(len(c) for c in conversations))
            return await go(lambda n: bar.advance(task, n))


def run(args: argparse.Namespace) -> int:
    """Run the ``replay`` command: 0 when no request failed, 1 otherwise, 2 on a bad FILE."""
    try:
        conversations = load_conversations(Path(args.file), args.limit, args.per_turn)
        tools = orjson.loads(Path(args.tools).read_bytes()) if args.tools else None
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"{args.tools}: expected a JSON array of tool definitions")
    except (OSError, ValueError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    summary = asyncio.run(_main(args, conversations, tools)).summary()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(summary) + b"\n")
        sys.stdout.flush()
    else:
        _print_table(summary)
    return 0 if summary["errors"] == 0 else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Fill the ``gateway replay`` parser."""
    p.add_argument("file", help="JSONL: one {'turns': [...]}, {'prompt': ...} or "
                                "{'messages': [...]} per line")
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--concurrency", type=int, default=8, help="conversations in flight")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="replay only the first N conversations")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--tools", help="a JSON array of OpenAI tool definitions, sent with every "
                                   "request")
    p.add_argument("--per-turn", action="store_true",
                   help="{'messages': [...]} lines: one request per recorded assistant turn")
    p.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    p.set_defaults(func=run)
