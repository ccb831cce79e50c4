"""Sends many requests through a running gateway, concurrently, and holds what the upstream
received for each against the contract (:func:`run`); :func:`requests_for` turns corpus
items into requests for either API. :data:`DIRECTIONS`: every way a request crosses the
gateway (a client API, the path it posts to, and a model whose upstream speaks the same API
or another one), which the fuzz drives.

Each request carries ``x-request-id: equivalence-N``, which the gateway forwards: that is
how an upstream record is matched with its request. Requests go in batches; the recorders
are read and cleared after each, so memory stays flat however many are sent.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.testing.fake_bedrock import FakeBedrock
from tests.gateway.equivalence.bedrock_wire import converse_as_messages, wire_error
from tests.gateway.equivalence.contract import check, responses_tools
from tests.gateway.equivalence.corpus import Item, anthropic_body
from tests.gateway.equivalence.harness import ROUTERS, Gateway

__all__ = ["APIS", "DIRECTIONS", "Direction", "Request", "Tally", "requests_for", "run"]

APIS = ("openai", "anthropic")
MODEL = {"openai": "gpt", "anthropic": "claude"}
ROUTER = {"openai": "auto-gpt", "anthropic": "auto-claude"}  # the keys of harness.ROUTERS
COUNT_TOKENS = "/v1/messages/count_tokens"


@dataclass(frozen=True)
class Direction:
    """One way through the gateway: a client of ``api`` (``openai``, ``anthropic``,
    ``responses``; ``count_tokens``: an Anthropic client counting tokens) asking ``model``
    (:data:`harness.MODELS`), whose upstream speaks ``upstream`` (``openai`` chat,
    ``anthropic``, ``responses`` natively, ``gemini``; ``vertex-claude``, ``vertex-gemini``:
    Vertex AI's; ``converse``: Bedrock's; ``estimate``: nothing, the gateway counts); ``via``:
    the upstream's type where it is not the API's own (``azure_openai``, ``bedrock``)."""

    api: str
    model: str
    upstream: str
    via: str = ""

    @property
    def name(self) -> str:
        return f"{self.api}->{self.upstream}" + (f"@{self.via}" if self.via else "")

    @property
    def same(self) -> bool:
        """The upstream speaks the client's API: the contract holds for what it received."""
        return self.api == self.upstream


DIRECTIONS = tuple(Direction(*d) for d in (
    ("openai", "gpt", "openai"), ("openai", "claude", "anthropic"),
    ("anthropic", "claude", "anthropic"), ("anthropic", "gpt", "openai"),
    ("responses", "gpt", "openai"), ("responses", "claude", "anthropic"),
    ("responses", "gpt-native", "responses"),
    ("count_tokens", "claude", "anthropic"), ("count_tokens", "gpt", "estimate"),
    # an azure_openai upstream (v1 form): OpenAI chat on the wire, Responses native
    ("openai", "gpt-azure", "openai", "azure_openai"),
    ("anthropic", "gpt-azure", "openai", "azure_openai"),
    ("responses", "gpt-azure", "responses", "azure_openai"),
    ("openai", "gemini", "gemini"), ("anthropic", "gemini", "gemini"),
    ("responses", "gemini", "gemini"), ("anthropic", "claude-vertex", "vertex-claude"),
    ("openai", "gemini-vertex", "vertex-gemini"),
    # bedrock upstreams: InvokeModel (the Messages body, read back for the contract) and
    # Converse (translated from each client API)
    ("openai", "claude-bedrock", "anthropic", "bedrock"),
    ("anthropic", "claude-bedrock", "anthropic", "bedrock"),
    ("responses", "claude-bedrock", "anthropic", "bedrock"),
    ("openai", "nova", "converse"), ("anthropic", "nova", "converse"),
    ("responses", "nova", "converse")))


def requests_for(items: Iterable[Item], api: str, *, routed_every: int = 0,
                 stream: bool = False) -> Iterator[Request]:
    """``items`` as requests for ``api``: for ``gpt`` or ``claude``, or every
    ``routed_every``-th for the API's router; streamed when ``stream``."""
    for n, item in enumerate(items):
        model = ROUTER[api] if routed_every and n % routed_every == 0 else MODEL[api]
        body = {**item.body, "model": model} if api == "openai" else \
            anthropic_body(item.body, model)
        headers = {}
        if stream:  # its own cache namespace: an item sent before too is no hit
            body["stream"] = True
            headers["x-gateway-cache-namespace"] = "streamed"
        yield Request(api, item.name, body, headers=headers)


@dataclass
class Request:
    """One request to send: ``api`` (``openai`` or ``anthropic``, or a fuzzed direction's:
    ``responses``, ``count_tokens``), the client's ``body`` (or, fuzzed, ``raw`` bytes,
    ``body`` then unused), ``name`` for a failure's message, extra ``headers``;
    ``direction``: a fuzzed request's (None: the contract's same-API run)."""

    api: str
    name: str
    body: Any
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    direction: Direction | None = None


@dataclass
class Tally:
    """What a run saw: requests ``sent``, held against the contract (``compared``), cache
    ``hits`` (and coalesced followers), requests that ``crossed`` to the other API (a fuzzed
    model name), fuzzed ``translated`` ones, statuses, what the gateway did within the
    contract, and the ``failures``."""

    sent: int = 0
    compared: int = 0
    hits: int = 0
    crossed: int = 0  # translated for an upstream of the other API: not this contract's
    translated: int = 0  # a fuzzed direction's 200 without a contract, checked for its shape
    routed: int = 0  # requests for a router name
    #: 200 answers carrying each of :data:`STAGE_HEADERS`: which stages ran
    stages: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    moved: Counter[str] = field(default_factory=Counter)
    markers: int = 0
    compressed: int = 0
    failures: list[str] = field(default_factory=list)

    def report(self, limit: int = 5) -> str:
        """The failures, the first ``limit`` of them in full: an assertion's message."""
        shown = "\n".join(f"- {f}" for f in self.failures[:limit])
        more = f"\n(and {len(self.failures) - limit} more)" if len(self.failures) > limit else ""
        return f"{len(self.failures)} of {self.sent} requests broke the contract:\n{shown}{more}"


#: Response headers that say a stage ran: rate_limit, cache, route, compress.
STAGE_HEADERS = ("x-ratelimit-limit-requests", "x-cache", "x-route-tier",
                 "x-gateway-compression")
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages",
         "responses": "/v1/responses", "count_tokens": COUNT_TOKENS}
_ANTHROPIC_HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
HEADERS = {"openai": {"content-type": "application/json"}, "anthropic": _ANTHROPIC_HEADERS,
           "responses": {"content-type": "application/json"},
           "count_tokens": _ANTHROPIC_HEADERS}
#: The client API whose error format each API's errors take.
ERRORS = {"openai": "openai", "responses": "openai", "anthropic": "anthropic",
          "count_tokens": "anthropic"}
#: What the gateway answers when something it did not expect broke (gateway.endpoint).
UNHANDLED = b"internal gateway error"


def run(gw: Gateway, requests: Iterable[Request], *, fuzz: bool = False,
        concurrency: int = 8, batch: int = 128) -> Tally:
    """Send ``requests`` ``concurrency`` at a time, a ``batch`` between two readings of the
    recorders (cleared each time). Not ``fuzz``: every answer must be a 200 (a cache hit
    counted, nothing to compare). ``fuzz``: no 5xx, every 4xx in the caller's API's error
    format, and every 2xx compared."""
    tally = Tally()
    asyncio.run(_run(gw, requests, tally, fuzz, concurrency, batch))
    return tally


async def _run(gw: Gateway, requests: Iterable[Request], tally: Tally, fuzz: bool,
               concurrency: int, batch: int) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(gw.url, connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as client:
        for chunk in _chunks(requests, batch):
            for fake in gw.recorders.values():
                fake.clear()
            queue: asyncio.Queue[tuple[int, Request]] = asyncio.Queue()
            for n, request in enumerate(chunk, tally.sent):
                queue.put_nowait((n, request))
            for request in chunk:
                gw.evidence.see(request.api, request.body if request.raw is None
                                else _exact(request.raw))
            answers: dict[int, Answer] = {}
            await asyncio.gather(*(_worker(client, queue, answers)
                                   for _ in range(concurrency)))
            received = {api: {r.headers.get("x-request-id"): r for r in fake.records}
                        for api, fake in gw.recorders.items()}
            for n, request in enumerate(chunk, tally.sent):
                found = {api: seen.get(_rid(n)) for api, seen in received.items()}
                _judge(gw, request, answers[n], found, tally, fuzz)
            tally.sent += len(chunk)


def _chunks(requests: Iterable[Request], size: int) -> Iterator[list[Request]]:
    chunk: list[Request] = []
    for request in requests:
        chunk.append(request)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _rid(n: int) -> str:
    return f"equivalence-{n}"


@dataclass(frozen=True)
class Answer:
    """A response as read (status 0: none came, ``content`` says why)."""

    status_code: int
    headers: Any
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


async def _worker(client: aiohttp.ClientSession, queue: asyncio.Queue[tuple[int, Request]],
                  answers: dict[int, Answer]) -> None:
    while not queue.empty():
        n, request = queue.get_nowait()
        raw: Any = request.raw if request.raw is not None else orjson.dumps(request.body)
        if len(raw) > 2 ** 20:  # aiohttp warns of (and would block on) bigger bytes
            raw = io.BytesIO(raw)
        headers = {**HEADERS[request.api], **request.headers, "x-request-id": _rid(n)}
        try:
            async with client.post(PATHS[request.api], data=raw, headers=headers) as response:
                answers[n] = Answer(response.status, response.headers, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:  # judged as no answer
            answers[n] = Answer(0, {}, repr(exc).encode())


def _judge(gw: Gateway, request: Request, answer: Answer, found: dict[str, Any],
           tally: Tally, fuzz: bool) -> None:
    """One answer, and what each upstream API's recorder received for it (``found``)."""
    record = found.get(request.api)
    status = answer.status_code
    tally.statuses[status] += 1
    where = f"{request.direction.name if request.direction else request.api} {request.name}"
    if status == 0:
        tally.failures.append(f"{where}: no answer ({answer.text})")
        return
    bedrock = gw.recorders.get("bedrock")  # its signature and wire shape, whatever the answer
    if isinstance(bedrock, FakeBedrock) and (why := wire_error(bedrock, found.get("bedrock"))):
        tally.failures.append(f"{where}: {why}")
        return
    if UNHANDLED in answer.content:  # a 500, or the error event that ends a stream
        tally.failures.append(f"{where}: status {status}, unhandled: {answer.text[-300:]}")
        return
    if status >= 500 or (status != 200 and not fuzz):
        tally.failures.append(f"{where}: status {status}: {answer.text[:300]}")
        return
    if status >= 400:
        why = _error_format(ERRORS[request.api], answer)
        if why is not None:
            tally.failures.append(f"{where}: status {status}, {why}")
        return
    if request.raw is None:
        client, received = request.body, record.json if record is not None else None
    else:  # exact numbers (orjson reads integers past 64 bits as floats)
        client, received = _exact(request.raw), _exact(record.body) if record else None
    tally.stages.update(h for h in STAGE_HEADERS if h in answer.headers)
    tally.routed += isinstance(client, dict) and client.get("model") in ROUTERS
    ended = _stream_end(request.api, client, answer)
    if ended is not None:
        tally.failures.append(f"{where}: {ended}")
        return
    if answer.headers.get("x-cache") == "hit" or "x-gateway-coalesced" in answer.headers:
        tally.hits += 1  # answered with another request's answer: nothing sent to compare
        return
    direction = request.direction
    if direction is not None and not (direction.same and direction.api in APIS):
        why = _translated(direction, client, answer, any(found.values())) or \
            _tools(direction, client, answer, found)
        tally.translated += 1
        if why is not None:
            tally.failures.append(f"{where}: {why}")
        return
    if record is None and any(found.values()):  # a fuzzed model of the other API's
        tally.crossed += 1
        return
    if record is None:
        tally.failures.append(f"{where}: a {status} answer, but the upstream received nothing")
        return
    client = client if isinstance(client, dict) else {}
    changing = gw.evidence.changing(request.api, client)
    verdict = check(request.api, client, received, gw.allowed(client.get("model"), changing))
    tally.compared += 1
    tally.moved.update(verdict.moved)
    tally.markers += verdict.markers
    tally.compressed += verdict.compressed
    if verdict.error is not None:
        tally.failures.append(f"{where}: {verdict.error}")


def _translated(direction: Direction, client: Any, answer: Answer, received: bool
                ) -> str | None:
    """What is wrong with a 200 that has no contract to keep (another API upstream, or
    count_tokens), if anything: the upstream must have received the request (unless the
    gateway counted), and the answer must be one of the client's API."""
    counted = answer.headers.get("x-gateway-token-count") == "estimate"  # (a fuzzed model)
    if not (received or counted):
        return "a 200 answer, but no upstream received anything"
    if isinstance(client, dict) and client.get("stream") is True:
        return None  # its end event was checked
    try:
        body = answer.json()
    except ValueError:
        return f"the answer is not JSON: {answer.text[:120]!r}"
    if not isinstance(body, dict):
        return f"the answer is not a JSON object: {answer.text[:120]!r}"
    ok = {"openai": lambda: isinstance(body.get("choices"), list),
          "anthropic": lambda: body.get("type") == "message",
          "responses": lambda: body.get("object") == "response",
          "count_tokens": lambda: isinstance(body.get("input_tokens"), int)}[direction.api]()
    return None if ok else f"not a {direction.api} answer: {answer.text[:160]!r}"


def _tools(direction: Direction, client: Any, answer: Answer, found: dict[str, Any]
           ) -> str | None:
    """T1 for a Responses request's tools (:func:`~.contract.responses_tools`), where an
    upstream received it (whichever: a fuzzed ``model`` may name another's model)."""
    if direction.api != "responses" or not isinstance(client, dict):
        return None
    record, upstream = found.get("anthropic"), "anthropic"
    received = _exact(record.body) if record is not None else None
    if record is None and (converse := found.get("converse")) is not None:
        received = converse_as_messages(converse)  # read as Messages: its tools
    elif record is None:
        record = found.get("openai")
        if record is None:
            return None
        upstream = "responses" if record.path.endswith("/responses") else "openai"
        received = _exact(record.body)
    return responses_tools(upstream, client, received,
                           answer.headers.get("x-gateway-dropped-tools"))


def _exact(raw: bytes) -> Any:
    """``raw`` parsed with integers kept exact (None when it does not parse, or nests too
    deep for Python's parser)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


_ENDS = {"openai": (b"data: [DONE]\n\n",), "anthropic": (b"event: message_stop\n",),
         "responses": (b"event: response.completed\n", b"event: response.incomplete\n")}


def _stream_end(api: str, client: Any, answer: Answer) -> str | None:
    """A streamed answer must end with its API's end event (a Responses stream's last event
    carries the whole response: searched for in the whole body)."""
    if not (isinstance(client, dict) and client.get("stream") is True) or api not in _ENDS:
        return None
    ends = _ENDS[api]
    tail = answer.content if api == "responses" else answer.content[-200:]
    if any(end in tail for end in ends):
        return None
    return f"the streamed answer does not end with {ends[0]!r}: ...{answer.content[-160:]!r}"


def _error_format(api: str, answer: Answer) -> str | None:
    """None when the error body is in ``api``'s format, else what is wrong with it."""
    try:
        body = answer.json()
    except ValueError:
        return f"the error is not JSON: {answer.text[:120]!r}"
    if api == "openai":
        error = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) \
            and isinstance(error.get("type"), str)
        return None if ok else f"not an OpenAI error object: {answer.text[:160]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    ok = body.get("type") == "error" and isinstance(error, dict) \
        and isinstance(error.get("type"), str) and isinstance(error.get("message"), str) \
        if isinstance(body, dict) else False
    return None if ok else f"not an Anthropic error object: {answer.text[:160]!r}"
