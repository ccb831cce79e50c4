"""Fuzzed bodies (:mod:`tests.gateway.equivalence.fuzz`: mutations of the built-in corpus's
requests and the suite's known bad bodies, a few thousand in all) sent raw through both
policies on both APIs: no answer is a server error (the fake upstreams answer 200, so a 5xx
means the gateway broke or forwarded something invalid), every 4xx is an error in the
caller's API's format, and for every 2xx the contract holds for what the upstream
received."""

from __future__ import annotations

import pytest

from tests.gateway.equivalence.builtin import builtin_items
from tests.gateway.equivalence.fuzz import deep_bodies, known_bad_bodies, mutants
from tests.gateway.equivalence.harness import Gateway
from tests.gateway.equivalence.runner import APIS, Request, requests_for, run

#: Mutants per API and policy.
COUNT = 1200


@pytest.mark.parametrize("api", APIS)
def test_fuzzed_bodies_get_no_server_error_and_keep_the_contract(gateway: Gateway, api: str):
    seeds = [(r.name, r.body) for r in requests_for(builtin_items(), api,
                                                    routed_every=gateway.routed_every)]
    known = [(f"known bad body {raw[:80]!r}", raw) for raw in known_bad_bodies(api)]
    assert len(known) >= 20, "the suite's bad-body cases were not found"
    bodies = [*known, *deep_bodies(*seeds[-1]), *mutants(seeds, COUNT, seed=APIS.index(api))]
    tally = run(gateway, (Request(api, name, None, raw=raw) for name, raw in bodies),
                fuzz=True)
    assert not tally.failures, tally.report()
    assert tally.sent == len(bodies)
    # The corpus reaches every kind of answer: refused at the door, and sent upstream.
    assert tally.statuses[400] > 100 and tally.compared > 100, tally.statuses
