"""The built-in corpus (:mod:`tests.gateway.equivalence.builtin`: no shared data needed)
through both policies and both APIs, streamed and not: every request reaches the upstream
within the contract, and of its system prompts only the standalone clock and date lines and
the line shown to change may move."""

from __future__ import annotations

import pytest

from tests.gateway.equivalence.builtin import FAMILY, NOW, builtin_items
from tests.gateway.equivalence.harness import Gateway
from tests.gateway.equivalence.runner import APIS, DIRECTIONS, requests_for, run

ITEMS = builtin_items()
#: Whole standalone lines a move is allowed for: the agent's clock, the structured prompt's
#: date line, the family's changing line. Dates in documents, lists, tables, code, JSON and
#: tagged sections never move.
MAY_MOVE = {NOW, "Current date: 2024-05-15", *FAMILY}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS)
def test_the_builtin_corpus_keeps_its_meaning(gateway: Gateway, api: str, stream: bool):
    # One at a time, in order: a family's requests reach the gateway as a sequence.
    tally = run(gateway, requests_for(ITEMS, api, routed_every=gateway.routed_every, stream=stream),
                concurrency=1)
    assert not tally.failures, tally.report()
    assert tally.compared == tally.sent == len(ITEMS)
    assert set(tally.moved) <= MAY_MOVE, sorted(set(tally.moved) - MAY_MOVE)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("api", "model"), [
    # an azure_openai upstream on its deployments form (the deployment in the URL, the
    # api-version in the query): what it receives is what an OpenAI upstream would
    ("openai", "gpt-azure-dep"),
    # Claude on Bedrock (InvokeModel): what it received, read back as a Messages body, is
    # what an Anthropic upstream would have (B1 aside), signed as Bedrock checks
    ("anthropic", "claude-bedrock"),
], ids=["azure-deployments", "bedrock-invoke"])
def test_the_builtin_corpus_keeps_its_meaning_through_a_cloud_upstream(
        gateway: Gateway, api: str, model: str, stream: bool):
    requests = list(requests_for(ITEMS, api, stream=stream))
    for request in requests:
        request.body["model"] = model
    tally = run(gateway, requests, concurrency=1)
    assert not tally.failures, tally.report()
    assert tally.compared == tally.sent == len(ITEMS)
    assert set(tally.moved) <= MAY_MOVE, sorted(set(tally.moved) - MAY_MOVE)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", APIS)
def test_the_builtin_corpus_reaches_bedrock_converse_as_valid_requests(
        gateway: Gateway, api: str, stream: bool):
    # Translated for Converse: each request as Bedrock would take it (shape, signature),
    # each answer a 200 of the client's API (a stream ending with its end event).
    direction = next(d for d in DIRECTIONS if d.api == api and d.upstream == "converse")
    requests = list(requests_for(ITEMS, api, stream=stream))
    for request in requests:
        request.body["model"] = direction.model
        request.direction = direction  # a namespace per API: the other's answers no hits
        request.headers["x-gateway-cache-namespace"] = f"converse-{api}-{stream}"
    tally = run(gateway, requests, concurrency=1)
    assert not tally.failures, tally.report()
    assert tally.translated == tally.sent == len(ITEMS)
