"""Routing by difficulty through the gateway, with the openai SDK as the client.

A tiny router artifact (8-dim embeddings, weights chosen by hand) makes every decision
predictable: the score rises with the numbers in the prompt, so "What is 12 + 30 + 7 ...?"
goes to the large tier and "Say hello" to the small one. The shipped artifact is tested on
its own (test_difficulty.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import openai
import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.policy import PolicyStore, load_policy
from gateway.routing.difficulty import Router
from gateway.routing.features import FEATURE_NAMES, text_features
from gateway.state import Gateway
from gateway.testing.fake_upstream import FakeUpstream
from gateway.tools.train_router import Model, save_artifact
from tests.conftest import DEFAULT_POLICY, GatewayServer, gateway_toml, wait_generation

DIM = 8
MODELS = """
[models."small-model"]
targets = [{ upstream = "fake", model = "small-upstream" }]

[models."large-model"]
targets = [{ upstream = "backup", model = "large-upstream" }]

[models."dead-small"]
targets = [{ upstream = "dead", model = "never" }]
"""
HARD = "What is 12 + 30 + 7 + 45 + 19 + 3 + 88 + 1?"
EASY = "Say hello"


def tiny_artifact(path: Path) -> Path:
    """A logistic regression on the log_numbers feature x alone: logits (0, 0, 2x - 2), so
    the score (P(only strong right) - P(only weak right)) rises with the numbers asked."""
    n = DIM + len(FEATURE_NAMES)
    w = np.zeros((n, 3), np.float32)
    w[DIM + FEATURE_NAMES.index("log_numbers"), 2] = 2.0
    b = np.array([0.0, 0.0, -2.0], np.float32)
    model = Model(np.zeros(n, np.float32), np.ones(n, np.float32), w, b, [])
    scores = np.linspace(-1.0, 1.0, 11)
    # Calibration: quality 1.0 needs everything scoring >= 0 on the strong tier.
    quality = np.array([1.0] * 6 + [0.9] * 5 + [0.8])
    save_artifact(path, model, (np.concatenate([scores, [2.0]]), np.arange(12) / 11, quality),
                  version="tiny-test")
    return path


def expected_score(text: str) -> float:
    a = 2.0 * float(text_features(text)[FEATURE_NAMES.index("log_numbers")]) - 2.0
    return (math.exp(a) - 1.0) / (2.0 + math.exp(a))


async def constant_embed(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), DIM), np.float32)
    out[:, 0] = 1.0
    return out


class CountingEmbed:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return await constant_embed(texts)


def routing_policy(artifact: Path, router: str = "", tiers: str = "") -> str:
    tiers = tiers or 'small = ["small-model"]\nlarge = ["large-model"]'
    return DEFAULT_POLICY + f"""
[routing.tiers]
{tiers}

[routing.routers.auto]
weak = "small"
strong = "large"
artifact = "{artifact}"
quality = 1.0
{router}
"""


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return tiny_artifact(tmp_path / "tiny.npz")


@pytest.fixture
def routed(make_gateway: Callable[..., GatewayServer], fake: FakeUpstream,
           artifact: Path) -> GatewayServer:
    return make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed)


def ask(gw: GatewayServer, text: str, model: str = "auto", stream: bool = False,
        **headers: str):
    with openai.OpenAI(base_url=gw.v1, api_key="k", max_retries=0) as c:
        r = c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": text}], stream=stream,
            extra_headers=headers or None)
        if stream:
            chunks = list(r.parse())
            return r.http_response, chunks
        return r.http_response, r.parse()


# --- policy parsing and errors -------------------------------------------------------------

def _policy_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def test_policy_parses_tiers_and_routers(tmp_path, artifact):
    policy = load_policy(_policy_file(tmp_path, routing_policy(
        artifact, 'models = ["small-model"]\nfallback = false')))
    routing = policy.routing
    assert routing.tiers == {"small": ("small-model",), "large": ("large-model",)}
    auto = routing.routers["auto"]
    assert (auto.weak, auto.strong, auto.quality, auto.fallback) == ("small", "large", 1.0, False)
    assert routing.router_for("auto") == ("auto", auto)
    assert routing.router_for("small-model") == ("auto", auto)  # opted in
    assert routing.router_for("large-model") is None  # passes through


@pytest.mark.parametrize(("router", "tiers", "message"), [
    ('weak = "tiny"', "", "names the tier 'tiny'"),
    ("quality = 0.9\nstrong_share = 0.5", "", "set one of quality, strong_share, threshold"),
    ('weak = "large"', "", "same tier"),
    ("", 'small = []\nlarge = ["large-model"]', "lists no models"),
    ("quality = 1.5", "", "must be <= 1.0"),
    ('models = ["auto"]', "", "is a router"),
    ("colour = 1", "", "unknown key"),
])
def test_policy_errors_name_the_problem(tmp_path, artifact, router, tiers, message):
    tiers = tiers or 'small = ["small-model"]\nlarge = ["large-model"]'
    text = DEFAULT_POLICY + f"""
[routing.tiers]
{tiers}

[routing.routers.auto]
artifact = "{artifact}"
{router}
"""
    with pytest.raises(ConfigError, match=message):
        load_policy(_policy_file(tmp_path, text))


def test_model_opted_into_two_routers_is_rejected(tmp_path, artifact):
    text = routing_policy(artifact, 'models = ["small-model"]') + f"""
[routing.routers.other]
artifact = "{artifact}"
models = ["small-model"]
"""
    with pytest.raises(ConfigError, match="opted into two routers"):
        load_policy(_policy_file(tmp_path, text))


@pytest.mark.parametrize(("policy_edit", "message"), [
    (lambda p: p.replace('large = ["large-model"]', 'large = ["gpt-9"]'),
     "the model 'gpt-9' is not configured"),
    (lambda p: p.replace("[routing.routers.auto]", '[routing.routers."small-model"]'),
     "a configured model has that name"),
    (lambda p: p.replace("tiny.npz", "missing.npz"), "cannot load"),
])
def test_gateway_checks_the_policy_against_its_models(tmp_path, fake_server, artifact,
                                                      policy_edit, message):
    (tmp_path / "policy.toml").write_text(policy_edit(routing_policy(artifact)))
    (tmp_path / "gateway.toml").write_text(gateway_toml(fake_server.url, MODELS))
    with pytest.raises(ConfigError, match=message):
        Gateway(load_config(tmp_path / "gateway.toml"))


def test_bad_routing_edit_is_rejected_live_and_the_old_policy_keeps_routing(
        make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed, watch=True)
    store: PolicyStore = gw.gateway.policies
    generation = store.generation
    gw.policy_path.write_text(routing_policy(artifact).replace('"large-model"', '"gpt-9"'))
    assert wait_generation(store, generation)
    assert store.rejected == 1
    response, _ = ask(gw, HARD)
    assert response.headers["x-route-tier"] == "large"


# --- decisions through the gateway -----------------------------------------------------------

def test_auto_routes_by_difficulty_with_headers_and_log_fields(routed):
    response, completion = ask(routed, HARD)
    assert response.headers["x-route-tier"] == "large"
    assert float(response.headers["x-route-score"]) == pytest.approx(expected_score(HARD),
                                                                     abs=1e-4)
    assert completion.model == "large-upstream"
    response, completion = ask(routed, EASY)
    assert response.headers["x-route-tier"] == "small"
    assert completion.model == "small-upstream"
    hard, easy = routed.logged(2)
    assert hard["model_requested"] == "auto" and hard["router"] == "auto"
    assert hard["route_tier"] == "large" and hard["model_served"] == "large-upstream"
    assert hard["route_score"] == pytest.approx(expected_score(HARD), abs=1e-4)
    assert hard["route_threshold"] == 0.0 and hard["route_fallback"] is None
    assert hard["route_ms"] >= 0
    assert easy["route_tier"] == "small" and easy["route_score"] < 0.0


def test_streamed_request_is_routed_too(routed):
    response, chunks = ask(routed, HARD, stream=True)
    assert response.headers["x-route-tier"] == "large"
    assert chunks[0].model == "large-upstream"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_explicit_model_passes_through_untouched(routed):
    response, completion = ask(routed, HARD, model="small-model")
    assert "x-route-tier" not in response.headers
    assert completion.model == "small-upstream"
    record = routed.logged(1)[0]
    assert record["router"] is None and record["route_tier"] is None


def test_opted_in_model_is_routed(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact, 'models = ["small-model"]'),
                      embed=constant_embed)
    response, completion = ask(gw, HARD, model="small-model")
    assert response.headers["x-route-tier"] == "large"
    assert completion.model == "large-upstream"
    assert gw.logged(1)[0]["router"] == "auto"


def test_models_list_shows_the_router(routed):
    with openai.OpenAI(base_url=routed.v1, api_key="k") as c:
        ids = [m.id for m in c.models.list()]
    assert "auto" in ids and "small-model" in ids


def test_decision_is_deterministic_for_a_fixed_artifact(routed, artifact):
    scores = {float(ask(routed, HARD)[0].headers["x-route-score"]) for _ in range(3)}
    assert len(scores) == 1
    router = Router(artifact)
    vector = np.zeros(DIM, np.float32)
    vector[0] = 1.0
    assert router.score(vector, text_features(HARD)) == pytest.approx(scores.pop(), abs=1e-4)


@pytest.mark.parametrize(("knob", "tier"), [
    ("", "large"),  # quality = 1.0 -> threshold 0.0 from the calibration curve
    ("strong_share = 0.0", "small"),
    ("strong_share = 1.0", "large"),
    ("threshold = 0.99", "small"),
])
def test_policy_target_sets_the_threshold(make_gateway, fake, artifact, knob, tier):
    policy = routing_policy(artifact)
    if knob:
        policy = policy.replace("quality = 1.0\n", knob + "\n")
    gw = make_gateway(MODELS, policy=policy, embed=constant_embed)
    assert ask(gw, HARD)[0].headers["x-route-tier"] == tier


def test_without_embeddings_requests_go_to_the_strong_tier(make_gateway, fake, artifact):
    async def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("embedder down")

    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=broken)
    response, completion = ask(gw, EASY)
    assert response.headers["x-route-tier"] == "large"
    assert "x-route-score" not in response.headers
    assert completion.model == "large-upstream"
    assert gw.logged(1)[0]["route_score"] is None


def test_routing_reuses_the_cache_embedding(make_gateway, fake, artifact):
    embed = CountingEmbed()
    policy = routing_policy(artifact) + "\n[cache]\nenabled = true\n"
    gw = make_gateway(MODELS + '\n[cache]\nenabled = true\nbackend = "memory"\n',
                      policy=policy, embed=embed)
    response, _ = ask(gw, HARD)
    assert response.headers["x-cache"] == "miss"
    assert response.headers["x-route-tier"] == "large"
    assert embed.calls == 1


# --- fallback -----------------------------------------------------------------------------------

def test_failing_tier_falls_back_to_the_other(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed)
    # The small tier's upstream answers 503 three times (every attempt), then recovers.
    response, completion = ask(gw, EASY, **{"x-fake-fail-times": "3", "x-fake-key": "fb"})
    assert response.status_code == 200
    assert response.headers["x-route-tier"] == "small"
    assert response.headers["x-route-fallback"] == "large"
    assert completion.model == "large-upstream"
    record = gw.logged(1)[0]
    assert record["route_tier"] == "small" and record["route_fallback"] == "large"
    assert record["model_served"] == "large-upstream"


def test_prompt_too_long_for_the_small_tier_falls_back(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed)
    too_long = {"x-fake-fail-times": "1", "x-fake-status": "400", "x-fake-key": "ctx",
                "x-fake-error-code": "context_length_exceeded"}
    response, completion = ask(gw, EASY, **too_long)
    assert response.headers["x-route-fallback"] == "large"
    assert completion.model == "large-upstream"


def test_other_client_errors_do_not_fall_back(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed)
    with pytest.raises(openai.BadRequestError):
        ask(gw, EASY, **{"x-fake-status": "400"})
    assert [r.json["model"] for r in fake.records] == ["small-upstream"]  # large never saw it


def test_unreachable_tier_falls_back_when_streaming(make_gateway, fake, artifact):
    tiers = 'small = ["dead-small"]\nlarge = ["large-model"]'
    gw = make_gateway(MODELS, policy=routing_policy(artifact, tiers=tiers), embed=constant_embed)
    response, chunks = ask(gw, EASY, stream=True)
    assert response.headers["x-route-fallback"] == "large"
    assert chunks[0].model == "large-upstream"


def test_without_fallback_the_failure_reaches_the_client(make_gateway, fake, artifact):
    tiers = 'small = ["dead-small"]\nlarge = ["large-model"]'
    gw = make_gateway(MODELS, policy=routing_policy(artifact, "fallback = false", tiers),
                      embed=constant_embed)
    with pytest.raises(openai.APIStatusError) as info:
        ask(gw, EASY)
    assert info.value.status_code == 502
    assert info.value.body["code"] == "upstream_unreachable"


def test_shedding_tier_falls_back(make_gateway, fake, artifact):
    # The small model may hold no request at all: every request to it is shed.
    policy = routing_policy(artifact) + """
[admission]
model_max_concurrency = { "small-model" = 1 }
max_queue = 0
"""
    gw = make_gateway(MODELS, policy=policy, embed=constant_embed)
    limiter = gw.gateway.model_limiters.get("small-model", gw.gateway.policy.admission)
    assert limiter is not None
    slot = gw.run(limiter.acquire("normal", False))  # someone else holds the only slot
    try:
        response, completion = ask(gw, EASY)
    finally:
        slot.release()
    assert response.headers["x-route-fallback"] == "large"
    assert completion.model == "large-upstream"


def test_gateway_check_reports_an_unknown_tier_model(tmp_path, fake_server, artifact, capsys):
    from gateway.cli import main

    (tmp_path / "policy.toml").write_text(
        routing_policy(artifact).replace('"large-model"', '"gpt-9"'))
    (tmp_path / "gateway.toml").write_text(gateway_toml(fake_server.url, MODELS))
    assert main(["check", str(tmp_path / "gateway.toml")]) == 2
    assert "the model 'gpt-9' is not configured" in capsys.readouterr().err


def test_router_added_by_reload_loads_the_embedder(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, watch=True)  # no cache, no router: no embedding model loaded
    assert gw.gateway.routers.embed is None
    store: PolicyStore = gw.gateway.policies
    generation = store.generation
    gw.policy_path.write_text(routing_policy(artifact).replace(
        f'artifact = "{artifact}"', 'artifact = "default"'))
    assert wait_generation(store, generation) and store.rejected == 0

    async def loaded() -> None:
        task = gw.gateway._loading  # started by the reload (call_soon_threadsafe ran first)
        assert task is not None
        await task

    gw.run(loaded(), timeout=120)
    response, _ = ask(gw, "Say hello")
    assert response.headers["x-route-tier"] in ("small", "large")
    assert "x-route-score" in response.headers  # scored: the embedding was there


def test_replaced_artifact_routes_after_the_policy_is_saved(make_gateway, fake, artifact):
    gw = make_gateway(MODELS, policy=routing_policy(artifact), embed=constant_embed, watch=True)
    assert ask(gw, EASY)[0].headers["x-route-tier"] == "small"
    with np.load(artifact) as data:  # retrained: now every prompt needs the strong tier
        arrays = dict(data)
    arrays["lr_b"] = arrays["lr_b"] + np.array([0.0, 0.0, 5.0], np.float32)
    np.savez(artifact, **arrays)
    store: PolicyStore = gw.gateway.policies
    generation = store.generation
    gw.policy_path.write_text(routing_policy(artifact) + "# retrained\n")
    assert wait_generation(store, generation)
    assert ask(gw, EASY)[0].headers["x-route-tier"] == "large"
