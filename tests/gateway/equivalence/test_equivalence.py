"""Every request built from ../shared/data reaches the upstream meaning what the client sent
(the contract: :mod:`tests.gateway.equivalence.contract`), as chat completions to an
OpenAI-compatible upstream and as /v1/messages to an Anthropic one.

What runs (measured on this 2-core CPU: the end-to-end path, client and checker included,
does 270-700 requests/s under the default policy, ~50/s for the requests the every-stage
policy compresses; the whole package takes about 80 s run alone):

- the default policy (a file holding only ``version``): every item of every source on both
  APIs: τ-bench 2,454 requests, NQ 2,655 in each layout, KV 500, chat 240 (17,008 in all);
- the every-stage policy: a deterministic stratified sample, every ``EVERY[source]``-th
  item of each source, the APIs taking turns (τ-bench 614, NQ 531 and 332, KV 250, chat
  240), a third of each API's asking its router;
- streamed, through both policies: every ``STREAMED``-th item of each source (τ-bench 60,
  NQ 65 and 65, KV 12, chat 6), the APIs taking turns, in a cache namespace of their own
  (as an item sent before, they would be cache hits: nothing to compare).

Without ../shared/data these tests skip; the built-in corpus (test_builtin.py) runs anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.gateway.equivalence.corpus import DATA, SOURCES, Item
from tests.gateway.equivalence.harness import Gateway
from tests.gateway.equivalence.runner import APIS, Request, Tally, requests_for, run

pytestmark = pytest.mark.skipif(
    not DATA.is_dir(), reason=f"the shared data ({DATA}) is absent: the equivalence runs over "
                              "it skip (the built-in corpus in test_builtin.py still runs)")

#: The every-stage sample: every k-th item of each source.
EVERY = {"tau": 4, "nq-system": 5, "nq-user": 8, "kv": 2, "chat": 1}
#: The streamed sample: every k-th item, from the k/2-th.
STREAMED = 41
#: What may leave the system prompt on the shared data: the τ-bench clock line, nothing else.
MAY_MOVE = {"tau": {"The current time is 2024-05-15 15:00:00 EST."}}
#: Cache hits (nothing reaches the upstream: nothing to compare) stay rare.
MAX_HIT_SHARE = 0.05


def items(source: str, every: int = 1, offset: int = 0) -> Iterator[Item]:
    return itertools.islice(SOURCES[source](), offset, None, every)


def taking_turns(sample: list[Item], gw: Gateway, stream: bool = False) -> Iterator[Request]:
    """The sample's even items as chat completions, its odd ones as /v1/messages."""
    streams = [requests_for(sample[i::2], api, routed_every=gw.routed_every, stream=stream)
               for i, api in enumerate(APIS)]
    for pair in itertools.zip_longest(*streams):
        yield from (r for r in pair if r is not None)


def assert_kept(tally: Tally, source: str) -> None:
    assert not tally.failures, tally.report()
    assert tally.compared + tally.hits == tally.sent > 0
    assert tally.hits <= MAX_HIT_SHARE * tally.sent, f"{tally.hits} cache hits"
    moved = set(tally.moved) - MAY_MOVE.get(source, set())
    assert not moved, f"lines moved out of {source}'s system prompts: {sorted(moved)[:3]}"


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("source", SOURCES)
def test_the_default_policy_keeps_every_request(default_gateway: Gateway, source: str,
                                                api: str):
    tally = run(default_gateway, requests_for(items(source), api))
    assert_kept(tally, source)
    assert tally.compressed == 0


@pytest.mark.parametrize("source", SOURCES)
def test_every_stage_keeps_a_sample_of_each_source(every_stage_gateway: Gateway, source: str):
    sample = list(items(source, EVERY[source]))
    tally = run(every_stage_gateway, taking_turns(sample, every_stage_gateway))
    assert_kept(tally, source)
    # Every stage ran: each answer was rate limited and looked up, a third routed...
    assert tally.stages["x-ratelimit-limit-requests"] == tally.stages["x-cache"] == tally.sent
    assert tally.stages["x-route-tier"] == tally.routed >= tally.sent // 3
    if source in ("nq-user", "kv"):  # ... and long context in the current turn compressed
        assert tally.stages["x-gateway-compression"] >= 0.9 * tally.sent
        assert tally.compressed >= 0.9 * tally.compared, tally.compressed


@pytest.mark.parametrize("source", SOURCES)
def test_streamed_requests_are_kept_too(gateway: Gateway, source: str):
    sample = list(items(source, STREAMED, STREAMED // 2))
    tally = run(gateway, taking_turns(sample, gateway, stream=True))
    assert_kept(tally, source)


#: The Bedrock sample: every k-th item of each source.
BEDROCK = 20


@pytest.mark.parametrize("source", SOURCES)
def test_bedrock_invoke_model_keeps_a_sample_of_each_source(default_gateway: Gateway,
                                                            source: str):
    # Claude on Bedrock (InvokeModel), every other request streamed: what it received, read
    # back as a Messages body, is what an Anthropic upstream would have (B1 aside).
    whole = requests_for(items(source, 2 * BEDROCK), "anthropic")
    streamed = requests_for(items(source, 2 * BEDROCK, BEDROCK), "anthropic", stream=True)
    requests = [r for pair in itertools.zip_longest(whole, streamed) for r in pair if r]
    for request in requests:
        request.body["model"] = "claude-bedrock"
    tally = run(default_gateway, requests)
    assert_kept(tally, source)
