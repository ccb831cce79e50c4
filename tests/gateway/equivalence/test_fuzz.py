"""Fuzzed bodies (:mod:`tests.gateway.equivalence.fuzz`: mutations of each API's seeds,
:mod:`tests.gateway.equivalence.seeds`, and the suite's known bad bodies) sent raw through
both policies in every direction the gateway has (:data:`~.runner.DIRECTIONS`: OpenAI chat,
Anthropic Messages and Responses clients, each to an upstream of its own API and of the
others', and count_tokens, forwarded or estimated): no answer is a server error (the fake
upstreams answer 200 or a 4xx of their API, so a 5xx, or the gateway's "internal gateway
error" ending a stream, means the gateway broke), every 4xx is an error in the caller's API's
format, every 2xx is an answer of the caller's API, and where the upstream speaks the
client's API the contract holds for what it received.

``make test`` sends :data:`COUNT` (500) mutants per direction and policy (200 for a cloud
provider's, :data:`CLOUD_COUNT`); ``make fuzz`` (.ci/run runs it after ``make test``) sets
``GATEWAY_FUZZ_COUNT`` to 5,000: 10,000 per direction.
"""

from __future__ import annotations

import os

import pytest

from tests.gateway.equivalence.fuzz import deep_bodies, known_bad_bodies, mutants
from tests.gateway.equivalence.harness import Gateway
from tests.gateway.equivalence.runner import DIRECTIONS, ROUTER, Direction, Request, run
from tests.gateway.equivalence.seeds import seeds

#: Mutants per direction and policy (``GATEWAY_FUZZ_COUNT`` sets another count).
#: ``make test``: 500 (``make fuzz`` repeats every direction at 5,000), to keep ``make test``
#: under its 8 minutes on a 2-core machine.
COUNT = int(os.environ.get("GATEWAY_FUZZ_COUNT", "500"))
#: The same for a cloud provider's direction (issue 50: an upstream type of its own) in
#: ``make test``: 200, to keep ``make test`` under its 8 minutes (their translators and
#: upstreams have their own tests); ``make fuzz`` sends them its full count too.
CLOUD_COUNT = int(os.environ.get("GATEWAY_FUZZ_COUNT", "200"))


@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.name)
def test_fuzzed_bodies_get_no_server_error_and_keep_the_contract(gateway: Gateway,
                                                                 direction: Direction):
    pairs = seeds(direction.api, direction.model)
    if direction.api in ROUTER and direction.same and not direction.via \
            and gateway.routed_every:  # some ask the API's router
        pairs = [(name, {**body, "model": ROUTER[direction.api]}
                  if n % gateway.routed_every == 0 else body)
                 for n, (name, body) in enumerate(pairs)]
    known = [(f"known bad body {raw[:80]!r}", raw)
             for raw in known_bad_bodies(direction.api, direction.model)]
    assert len(known) >= 20, "the suite's bad-body cases were not found"
    seed = 2 * DIRECTIONS.index(direction) + gateway.every
    cloud = bool(direction.via) or direction.upstream not in (
        "openai", "anthropic", "responses", "estimate")
    count = CLOUD_COUNT if cloud else COUNT
    bodies = [*known, *deep_bodies(*pairs[-1]), *mutants(pairs, count, seed=seed)]
    tally = run(gateway, (Request(direction.api, name, None, raw=raw, direction=direction)
                          for name, raw in bodies), fuzz=True)
    assert not tally.failures, tally.report()
    assert tally.sent == len(bodies)
    # The corpus reaches every kind of answer: refused at the door, and answered.
    answered = tally.compared + tally.translated
    assert tally.statuses[400] > count // 10 and answered > count // 10, tally.statuses
