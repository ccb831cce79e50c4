"""The servers of the harness: a gateway per policy (real HTTP on loopback) in front of three
recording fakes (``FakeUpstream`` for OpenAI, chat and Responses, ``FakeAnthropic`` for
Anthropic, ``FakeGoogle`` for the Gemini API and Vertex AI's Claude and Gemini, its token
endpoint signing a service account in; uvicorn in threads): :data:`MODELS` names a model of
each API and upstream type, and ``gpt-native``,
whose upstream serves ``/v1/responses`` itself, so that a request can take every direction
(:data:`tests.gateway.equivalence.runner.DIRECTIONS`); ``gpt-azure`` (Azure's v1 form, its
Responses native) and ``gpt-azure-dep`` (its deployments form) reach the OpenAI recorder
through ``azure_openai`` upstreams and a FakeAzure in front of it (which checks their key);
``claude-bedrock`` (InvokeModel, the Messages body) and ``nova`` (Converse) reach a FakeBedrock
recorder through ``bedrock`` upstreams signing with the AWS key :func:`aws_env` gives the
gateway (read as the runner reads it: :mod:`~tests.gateway.equivalence.bedrock_wire`). The
default policy's gateway is
``gateway serve`` in a process of its own, so it runs beside the client and the checks
instead of sharing their GIL; the every-stage one, which takes a deterministic embedding
function, runs in a thread as ``tests/conftest.py``'s ``make_gateway`` builds them.

Policies: :data:`DEFAULT` (a file holding only ``version``) and :func:`every_stage` (every
stage in the pipeline and on: generous rate limits, the response cache with a deterministic
embedding, two routers over tiers of same-API models, compression with ``gate = "always"``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.app import create_app
from gateway.compression.tokens import o200k
from gateway.config import load_config
from gateway.testing.fake_anthropic import FakeAnthropic
from gateway.testing.fake_azure import FakeAzure
from gateway.testing.fake_bedrock import FakeBedrock
from gateway.testing.fake_gemini import FakeGoogle
from gateway.testing.fake_upstream import FakeUpstream
from gateway.testing.google_tokens import TokenIssuer
from gateway.testing.server import ServerThread
from gateway.upstreams.ports import free_port
from tests.conftest import wait_until_ready
from tests.gateway.equivalence.bedrock_wire import AnthropicRecords, ConverseRecords, Recording
from tests.gateway.equivalence.contract import Allowed
from tests.gateway.equivalence.evidence import Evidence
from tests.gateway.routing.test_routing import DIM, tiny_artifact

__all__ = ["DEFAULT", "MODELS", "ROUTERS", "Gateway", "artifact", "aws_env", "every_stage",
           "hashed_embed", "start_gateway", "start_recorders"]

KEY_ENV = "GATEWAY_TEST_EQUIVALENCE_KEY"
UPSTREAM_KEY = "sk-ant-equivalence"
AZURE_KEY_ENV, AZURE_KEY = "GATEWAY_TEST_EQUIVALENCE_AZURE_KEY", "azure-equivalence"
#: public model -> (upstream, upstream model)
MODELS = {"gpt": ("eq-openai", "gpt-upstream"), "gpt-mini": ("eq-openai", "gpt-mini-upstream"),
          "claude": ("eq-claude", "claude-upstream"),
          "claude-haiku": ("eq-claude", "claude-haiku-upstream"),
          # /v1/responses served by the upstream itself (the others' go through chat)
          "gpt-native": ("eq-openai-native", "gpt-native-upstream"),
          # Azure OpenAI (type azure_openai): the v1 form (Responses native), the deployments one
          "gpt-azure": ("eq-azure", "gpt-azure-deployment"),
          "gpt-azure-dep": ("eq-azure-dep", "gpt-azure-deployment"),
          # Google: the Gemini API (its key), Vertex AI's Claude and Gemini (OAuth tokens)
          "gemini": ("eq-gemini", "gemini-upstream"),
          "claude-vertex": ("eq-vertex-claude", "claude-vertex-upstream"),
          "gemini-vertex": ("eq-vertex-gemini", "gemini-vertex-upstream"),
          # Amazon Bedrock: Claude through InvokeModel (a cross-region profile id, its ":"
          # percent-encoded in the path), any model through Converse (prompt caching on)
          "claude-bedrock": ("eq-bedrock", "us.anthropic.claude-eq-v1:0"),
          "nova": ("eq-bedrock-converse", "amazon.nova-eq-v1:0")}
#: The AWS variables the gateway must not see (botocore's chain would take them first).
AWS_UNSET = ("AWS_SESSION_TOKEN", "AWS_PROFILE")
#: router name -> its two tiers' models (same API, so nothing is translated)
ROUTERS = {"auto-gpt": ("gpt-mini", "gpt"), "auto-claude": ("claude-haiku", "claude")}

DEFAULT = 'version = "equivalence-default"\n'


def every_stage(artifact: Path) -> str:
    routers = "".join(f"""
[routing.routers.{name}]
weak = "{name}-small"
strong = "{name}-large"
artifact = "{artifact}"
strong_share = 0.5
""" for name in ROUTERS)
    tiers = "".join(f'"{name}-small" = ["{weak}"]\n"{name}-large" = ["{strong}"]\n'
                    for name, (weak, strong) in ROUTERS.items())
    return f"""version = "equivalence-every-stage"

[pipeline]
stages = ["rate_limit", "cache", "route", "compress", "prompt_cache", "admission"]

[rate_limits]
default = {{ requests_per_minute = 10000000, tokens_per_minute = 100000000000 }}

[cache]
enabled = true
semantic = true

[compression]
enabled = true
gate = "always"
min_tokens = 256

[routing.tiers]
{tiers}{routers}"""


def aws_env(fake: FakeBedrock, tmp: Path) -> dict[str, str]:
    """The environment botocore's chain reads for the gateway's ``bedrock`` upstreams: the
    fake's key and region, no shared files, no instance metadata."""
    return {"AWS_ACCESS_KEY_ID": fake.access_key, "AWS_SECRET_ACCESS_KEY": fake.secret_key,
            "AWS_REGION": fake.region, "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true"}


def _config(openai_url: str, claude_url: str, azure_url: str, google_url: str,
            bedrock_url: str, key_file: Path, cache: bool) -> str:
    models = "".join(f'[models."{name}"]\ntargets = [{{ upstream = "{up}", model = "{model}" }}]\n'
                     for name, (up, model) in MODELS.items())
    return f"""
[server]
policy = "policy.toml"
policy_reload = false
max_body_bytes = 1048576

[logging]
requests = false

[upstreams.eq-openai]
type = "openai"
base_url = "{openai_url}/v1"

[upstreams.eq-openai-native]
type = "openai"
base_url = "{openai_url}/v1"
native_responses = true

[upstreams.eq-claude]
type = "anthropic"
base_url = "{claude_url}"
api_key_env = "{KEY_ENV}"

[upstreams.eq-azure]
type = "azure_openai"
base_url = "{azure_url}"
api_key_env = "{AZURE_KEY_ENV}"
native_responses = true

[upstreams.eq-azure-dep]
type = "azure_openai"
base_url = "{azure_url}"
api_key_env = "{AZURE_KEY_ENV}"
azure = {{ url_form = "deployments" }}

[upstreams.eq-gemini]
type = "gemini"
base_url = "{google_url}"
api_key_env = "{KEY_ENV}"

[upstreams.eq-vertex-claude]
type = "vertex"
base_url = "{google_url}"
google = {{ project = "fake-project", publisher = "anthropic", credentials_file = "{key_file}" }}

[upstreams.eq-vertex-gemini]
type = "vertex"
base_url = "{google_url}"
google = {{ project = "fake-project", publisher = "google", credentials_file = "{key_file}" }}

[upstreams.eq-bedrock]
type = "bedrock"
base_url = "{bedrock_url}"

[upstreams.eq-bedrock-converse]
type = "bedrock"
base_url = "{bedrock_url}"
bedrock = {{ api = "converse" }}

{models}
[cache]
enabled = {"true" if cache else "false"}
backend = "memory"
"""


async def hashed_embed(texts: list[str]) -> np.ndarray:
    """A deterministic unit vector per text (distinct texts are far apart: no semantic hit
    between different requests), of the tiny router artifact's dimension."""
    out = np.empty((len(texts), DIM), np.float32)
    for i, text in enumerate(texts):
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).normal(size=DIM)
        out[i] = v / np.linalg.norm(v)
    return out


class GatewayProcess:
    """``gateway serve`` in a process of its own (stopped by :meth:`stop`, as a ServerThread
    is): the default policy's gateway runs beside the client, the checks and the fakes
    instead of sharing their GIL (the harness is CPU-bound: about 25% of the work is the
    gateway's)."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        inherited = {k: v for k, v in os.environ.items() if k not in AWS_UNSET}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port",
             str(port)], env={**inherited, **env}, stdout=subprocess.DEVNULL)
        try:
            wait_until_ready(self.url, self.process)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:  # not drained in time: never left running
            self.process.kill()
            self.process.wait()


@dataclass
class Gateway:
    """A running gateway, the recording fakes behind it, and what its policy allows;
    ``every``: the every-stage policy (routers, compression...), else the default one."""

    url: str
    #: by the API they record (``bedrock``: the fake Bedrock's requests as they came)
    recorders: dict[str, Recording]
    every: bool
    server: ServerThread | GatewayProcess
    evidence: Evidence = field(default_factory=Evidence)

    @property
    def routed_every(self) -> int:
        """Requests for a router name: every third under the every-stage policy (the
        default one has no router)."""
        return 3 if self.every else 0

    def allowed(self, model: Any, changing: frozenset[str] = frozenset()) -> Allowed:
        """G1 and route: the upstream models a request for ``model`` may reach."""
        names = ROUTERS.get(model, (model,)) if isinstance(model, str) else ()
        known = [MODELS[n] for n in names if n in MODELS]
        return Allowed(frozenset(m for _, m in known), self.every, changing,
                       bedrock=any(up == "eq-bedrock" for up, _ in known))


def start_gateway(tmp: Path, policy: str, recorders: dict[str, tuple[FakeUpstream, str]],
                  every: bool) -> Gateway:
    """A gateway for ``policy`` (``every``: the every-stage policy, with the cache and the
    deterministic embedding, in this process; else in a process of its own); stop its
    ``server`` when done."""
    if every:
        # Loaded here, on the test's thread: the gateway's own warm-up thread silences a
        # DeprecationWarning with warnings.catch_warnings, which is not thread-safe, so under
        # pytest's "warnings are errors" it can escape as that thread's exception.
        o200k()
    (tmp / "policy.toml").write_text(policy)
    google = recorders["google"][0]
    assert isinstance(google, FakeGoogle) and google.issuer is not None
    (tmp / "service-account.json").write_bytes(orjson.dumps(google.issuer.account))
    bedrock = recorders["bedrock"][0]
    assert isinstance(bedrock, FakeBedrock)
    (tmp / "gateway.toml").write_text(
        _config(recorders["openai"][1], recorders["anthropic"][1], recorders["azure"][1],
                recorders["google"][1], recorders["bedrock"][1], tmp / "service-account.json",
                cache=every))
    # (the Azure fake records into the OpenAI recorder; InvokeModel's read back as Messages)
    recording: dict[str, Recording] = {
        api: fake for api, (fake, _) in recorders.items() if api != "azure"}
    recording["anthropic"] = AnthropicRecords(recorders["anthropic"][0], bedrock)
    recording["converse"] = ConverseRecords(bedrock)
    env = {KEY_ENV: UPSTREAM_KEY, AZURE_KEY_ENV: AZURE_KEY, **aws_env(bedrock, tmp)}
    if not every:
        process = GatewayProcess(tmp / "gateway.toml", env)
        return Gateway(process.url, recording, every, process)
    with pytest.MonkeyPatch.context() as mp:  # the upstreams read their keys as they start
        for name, value in env.items():
            mp.setenv(name, value)
        for name in AWS_UNSET:
            mp.delenv(name, raising=False)
        app = create_app(load_config(tmp / "gateway.toml"), request_sink=lambda record: None,
                         watch_policy=False, embed=hashed_embed)
        server = ServerThread(app).start()
    return Gateway(server.url, recording, every, server)


def start_recorders() -> dict[str, tuple[FakeUpstream, ServerThread]]:
    """The recording fakes by API (``bedrock``: InvokeModel's and Converse's), and
    ``azure``: a FakeAzure in front of the OpenAI one."""
    out: dict[str, tuple[FakeUpstream, ServerThread]] = {}
    for api, fake in (("openai", FakeUpstream()), ("anthropic",
                                                   FakeAnthropic(api_key=UPSTREAM_KEY)),
                      ("google", FakeGoogle(gemini_key=UPSTREAM_KEY)),
                      ("bedrock", FakeBedrock())):
        out[api] = (fake, ServerThread(fake).start())
    openai = out["openai"][0]
    out["azure"] = (openai, ServerThread(FakeAzure(api_key=AZURE_KEY, inner=openai)).start())
    google, server = out["google"]
    assert isinstance(google, FakeGoogle)
    google.issuer = TokenIssuer.of(server.url + "/token")  # Vertex's service account
    return out


def artifact(tmp: Path) -> Path:
    return tiny_artifact(tmp / "tiny-router.npz")
