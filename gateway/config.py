"""The gateway's static configuration: ``gateway.toml`` -> frozen, typed objects.

Read once at start-up (``gateway check CONFIG`` validates without serving). What changes at
run time lives in the policy file (see :mod:`gateway.policy`), which is reloaded live.

Example: see ``gateway.example.toml`` and the configuration reference in README.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gateway.connection_limits import ConnectionSettings
from gateway.errors import ConfigError
from gateway.http import HeaderAllow
from gateway.model_config import ModelConfig, Target, check_models
from gateway.paths import DEFAULT_PASSTHROUGH, Pattern
from gateway.replicas.config import PoolConfig
from gateway.schema import bounded, load_toml, parse
from gateway.secret import SecretConfig
from gateway.store_config import CacheConfig, ResponsesConfig, checked_redis_url
from gateway.stream_store import StreamsConfig
from gateway.tracing_config import TracingConfig
from gateway.upstreams.azure_config import AzureOptions, check_azure
from gateway.upstreams.bedrock_config import BedrockOptions
from gateway.upstreams.google_config import GEMINI_API_URL, GoogleOptions, vertex_url

__all__ = [
    "AuthConfig",
    "CacheConfig",
    "Config",
    "EngineOptions",
    "GatewayKey",
    "LoggingConfig",
    "ModelConfig",
    "RateLimitConfig",
    "ResponsesConfig",
    "SecretConfig",
    "ServerConfig",
    "SpeculativeOptions",
    "Target",
    "TracingConfig",
    "UpstreamConfig",
    "load_config",
]


@dataclass(frozen=True)
class ServerConfig(ConnectionSettings):
    """``[server]``: where and how the gateway serves; the limits on client connections
    (header size, timeouts, connection caps) are :class:`ConnectionSettings`' keys."""

    host: str = "127.0.0.1"
    port: int = bounded(8080, ge=0, le=65535)
    #: Request bodies above this many bytes get 413.
    max_body_bytes: int = bounded(10 * 1024 * 1024, ge=1024)
    #: Policy file, relative to the config file's folder.
    policy: str = "policies/default.toml"
    #: Watch the policy file and swap in valid edits without a restart.
    policy_reload: bool = True
    #: SIGTERM: how long requests in flight may take to finish (s); then streams end with
    #: an error event and the process exits (see gateway.drain).
    drain_timeout_s: float = bounded(25.0, ge=0.0, le=3600.0)
    #: /metrics on a listener of its own (0: any free port; on ``metrics_host``, by default
    #: ``host``), not on the main port. Unset: on the main port.
    metrics_port: int | None = bounded(None, ge=0, le=65535)
    metrics_host: str | None = None
    #: Environment variable (set at start) holding the bearer token /metrics then requires.
    #: Unset: /metrics is open (aggregate counts only: no key, id or path in a label).
    metrics_key_env: str | None = None


@dataclass(frozen=True)
class GatewayKey:
    """A client key: ``id`` is what logs show; the secret comes from ``key_env`` or its SHA-256."""

    id: str
    key_env: str | None = None
    sha256: str | None = None
    #: The ``anthropic-beta``/``openai-beta`` features this key may send upstream (e.g.
    #: ``"prompt-caching-2024-07-31"``); others are removed. Unset: any.
    betas: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.key_env is None) == (self.sha256 is None):
            raise ValueError(f"key {self.id!r}: set exactly one of key_env, sha256")
        if not self.id or "/" in self.id:  # "KEY/NAME": a key's cache namespace NAME
            raise ValueError(f"key {self.id!r}: an id is non-empty and holds no '/'")
        if self.betas is not None:
            object.__setattr__(self, "betas", tuple(b.strip().lower() for b in self.betas))


@dataclass(frozen=True)
class AuthConfig:
    #: Empty: the gateway accepts any (or no) Authorization header.
    keys: tuple[GatewayKey, ...] = ()


@dataclass(frozen=True)
class SpeculativeOptions:
    """``[upstreams.NAME.engine] speculative = { method = "ngram", ... }``: lossless n-gram
    speculative decoding in the engine (``local_engine.speculative.SpecConfig``). On by
    default: ``bench/engine.py --spec`` measured it paying on open chat at batch 1 as well
    as on input-grounded answers, and costing nothing at batch 32; ``method = "off"``."""

    method: Literal["off", "ngram"] = "ngram"
    #: The most draft tokens a sequence verifies per step (each adapts below it).
    num_tokens: int = bounded(8, ge=1, le=16)
    #: Suffix lengths looked up in the prompt and output, longest first.
    min_n: int = bounded(3, ge=1, le=16)
    max_n: int = bounded(4, ge=1, le=16)
    #: No speculation in a step with more decoding sequences than this...
    max_batch_size: int = bounded(4, ge=1, le=1024)
    #: ... or whose decodes with drafts could exceed this many tokens.
    max_step_tokens: int = bounded(64, ge=2)
    #: A sequence whose recent share of accepted draft tokens falls below this stops
    #: drafting for pause_steps steps.
    min_acceptance: float = bounded(0.25, ge=0.0, le=1.0)
    pause_steps: int = bounded(16, ge=0)
    ewma: float = bounded(0.3, ge=0.0, le=1.0)

    def __post_init__(self) -> None:
        if self.min_n > self.max_n:
            raise ValueError("speculative.min_n must be at most max_n")


@dataclass(frozen=True)
class EngineOptions:
    """``[upstreams.NAME.engine]`` of a ``type = "local"`` upstream: the co-located engine
    the gateway starts as a child process (``python -m local_engine``)."""

    #: "smollm2" (the packaged SmolLM2-135M-Instruct), a safetensors folder or a GGUF file.
    model: str = "smollm2"
    #: Loopback port of the engine; 0 picks a free one.
    port: int = bounded(0, ge=0, le=65535)
    #: Memory for the paged KV cache (MiB).
    kv_cache_mb: int = bounded(1024, ge=1)
    max_num_seqs: int = bounded(32, ge=1, le=1024)
    #: The gateway admits at most the batch whose decode step is at most this many times a
    #: lone sequence's, measured by the engine at start-up (local_engine.calibrate: 7 to 11
    #: of 32 on a 2-core CPU in bf16, all of them on a GPU); 0: max_num_seqs. Higher: more
    #: goodput under a flood, slower admitted answers.
    max_step_slowdown: float = bounded(1.3, ge=0.0, le=100.0)
    #: CPU priority of the engine process below the gateway's (Linux nice, 0: the same):
    #: the gateway's event loop answers every request, sheds included, while a batch step
    #: can wait a moment (bench/flood.py on 2 cores: shed p99 80 ms at 0, 31 ms at 10).
    nice: int = bounded(10, ge=0, le=19)
    #: Tokens computed per engine step (decodes plus prefill chunks).
    max_batch_tokens: int = bounded(512, ge=16)
    #: Prompt plus output (tokens).
    max_model_len: int = bounded(2048, ge=64)
    #: Output tokens when a request sets no max_tokens.
    default_max_tokens: int = bounded(512, ge=1)
    #: Compute dtype: "auto" (bfloat16 on CUDA and on CPUs with AVX512-BF16 or AMX, where a
    #: decode step is 1.4-1.6x faster than float32's on 2 cores; float32 elsewhere),
    #: "float32" or "bfloat16". Greedy outputs differ between the two in near-ties.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    #: Weights quantized at load (local_engine.quantize): "none"; "int8", weight-only INT8
    #: per output channel on a CPU (2 AMX cores in bfloat16: decode at batch 1 1.6x, at
    #: batch 32 0.76x, half the weight bytes, perplexity +1%); "fp8" on CUDA of compute
    #: capability 8.9 or more. Off by default: it pays only at small batches.
    quantization: Literal["none", "int8", "fp8"] = "none"
    #: The KV cache's storage (local_engine.kv_cache): "auto" (the compute dtype), "int8"
    #: or "fp8" (a scale per token and head: about 1.9x the tokens in the same
    #: kv_cache_mb in bfloat16, 3.8x in float32). Off by default for the same reason.
    kv_cache_dtype: Literal["auto", "int8", "fp8"] = "auto"
    #: Also serve all-MiniLM-L6-v2 embeddings.
    embeddings: bool = True
    #: Requests wait this long for the engine to finish loading (ms).
    start_timeout_ms: int = bounded(300_000, ge=1_000)
    #: On CUDA, replay decode steps as CUDA graphs (never used on a CPU).
    cuda_graphs: bool = True
    #: N-gram speculative decoding (method "ngram", the default, or "off").
    speculative: SpeculativeOptions = SpeculativeOptions()

    def __post_init__(self) -> None:
        if self.max_batch_tokens < self.max_num_seqs:
            raise ValueError("max_batch_tokens must be at least max_num_seqs")


@dataclass(frozen=True)
class UpstreamConfig:
    """One upstream. ``type = "openai"``: any OpenAI-compatible base URL. ``type = "anthropic"``:
    the Anthropic Messages API (``base_url`` without ``/v1``, as the anthropic SDK takes it;
    default https://api.anthropic.com). ``type = "local"``: the co-located engine, started and
    stopped with the gateway (settings in ``engine``). ``type = "azure_openai"``: Azure
    OpenAI, ``base_url`` its resource endpoint (settings in ``azure``). ``type = "bedrock"``:
    Amazon Bedrock, signed with AWS credentials from the environment (settings in
    ``bedrock``). ``type = "gemini"`` (the Gemini API) and ``type = "vertex"`` (Vertex AI,
    Gemini or Claude): settings in ``google``."""

    type: Literal["openai", "anthropic", "local", "azure_openai", "bedrock", "gemini", "vertex"]
    base_url: str = ""
    #: Environment variable holding the upstream key. When set here but absent from the
    #: environment, the upstream is disabled and routing skips it.
    api_key_env: str | None = None
    connect_timeout_ms: int = bounded(2_000, ge=1)
    #: Longest silence allowed between two reads of a response (ms), per attempt. Default:
    #: 120 s; 600 s for ``local``, where a whole answer is one silence (a CPU engine under
    #: load decodes a few tokens a second per sequence) and clients wait that long (the
    #: openai and anthropic SDKs' default timeout).
    read_timeout_ms: int | None = bounded(None, ge=1)
    max_connections: int = bounded(512, ge=1)
    #: Extra headers sent with every request to this upstream.
    headers: dict[str, str] = field(default_factory=dict)
    #: ``type = "anthropic"``: the ``anthropic-version`` header sent when the client sends
    #: none, and ``anthropic-beta`` features always sent (a client's own are added).
    anthropic_version: str = "2023-06-01"
    beta: tuple[str, ...] = ()
    #: A semantic-cache hit found after this upstream was sent the request (the lookup ran
    #: past ``cache.lookup_budget_ms``) cancels the call and is served. Default: on for
    #: ``local`` (cancelling frees the batch slot), off for hosted APIs, which may bill a
    #: started request: there the late hit is only counted and the upstream's answer served.
    cancel_on_late_hit: bool | None = None
    #: ``type = "openai"``: the upstream serves ``/v1/responses`` itself (OpenAI does; many
    #: OpenAI-compatible servers do not). A Responses request then goes to it as it is,
    #: hosted tools and ``previous_response_id`` included; otherwise it is translated to
    #: the upstream's chat endpoint.
    native_responses: bool = False
    #: ``type = "openai"``: base URLs of replicas of one model server (gateway.replicas),
    #: or ``discover``, a URL whose host resolves to one address per replica (a Kubernetes
    #: headless Service), resolved again every ``pool.discover_interval_s``; ``pool``: how
    #: they are routed and watched. Either one replaces ``base_url``.
    replicas: tuple[str, ...] = ()
    discover: str = ""
    pool: PoolConfig = field(default_factory=PoolConfig)

    #: ``type = "openai"``: client paths forwarded as they are (gateway.passthrough), as
    #: gateway.paths.Pattern (``/v1/files/**``). Unset: the stateless endpoints
    #: (gateway.paths.DEFAULT_PASSTHROUGH); stateful ones only when listed (then per key:
    #: gateway.ownership).
    passthrough: tuple[str, ...] | None = None
    #: Client headers sent beyond gateway.http.FORWARDED: names, or prefixes (``x-v-*``).
    forward_headers: tuple[str, ...] = ()

    engine: EngineOptions = field(default_factory=EngineOptions)
    #: ``type = "azure_openai"``: URL form, api-version, Entra ID token source
    #: (gateway.upstreams.azure_config).
    azure: AzureOptions = field(default_factory=AzureOptions)
    #: ``type = "bedrock"``: Amazon Bedrock (gateway.upstreams.bedrock_config).
    bedrock: BedrockOptions = field(default_factory=BedrockOptions)
    #: ``type = "gemini"`` / ``"vertex"``: project, location, publisher, credentials
    #: (gateway.upstreams.google_config).
    google: GoogleOptions = field(default_factory=GoogleOptions)

    def __post_init__(self) -> None:
        if self.passthrough is None:
            object.__setattr__(self, "passthrough",
                               DEFAULT_PASSTHROUGH if self.type == "openai" else ())
        elif self.passthrough and self.type != "openai":
            raise ValueError("passthrough applies to type 'openai' only")
        for pattern in self.passthrough or ():
            Pattern(pattern)  # ValueError names it
        HeaderAllow(self.forward_headers)
        if self.native_responses and self.type not in ("openai", "azure_openai"):
            raise ValueError("native_responses applies to types 'openai' and 'azure_openai'")
        check_azure(self.type, self.base_url, self.api_key_env, self.native_responses, self.azure)
        if (self.replicas or self.discover) and (self.type != "openai" or self.base_url):
            raise ValueError("replicas and discover apply to type 'openai', without base_url")
        if self.replicas and self.discover:
            raise ValueError("set replicas or discover, not both")
        if self.discover and not self.discover.startswith(("http://", "https://")):
            raise ValueError("discover must be a URL such as http://engines:8000/v1")
        if self.cancel_on_late_hit is None:
            object.__setattr__(self, "cancel_on_late_hit", self.type == "local")
        if self.read_timeout_ms is None:
            object.__setattr__(self, "read_timeout_ms",
                               600_000 if self.type == "local" else 120_000)
        if self.type == "anthropic" and not self.base_url:
            object.__setattr__(self, "base_url", "https://api.anthropic.com")
        if self.type in ("gemini", "vertex") and not self.base_url:
            object.__setattr__(self, "base_url", GEMINI_API_URL if self.type == "gemini"
                               else vertex_url(self.google.location))
        if self.type == "gemini" and not self.api_key_env:
            raise ValueError("type 'gemini' needs api_key_env (the Gemini API key's variable)")
        if self.type == "openai" and not (self.base_url or self.replicas or self.discover):
            raise ValueError(f"type {self.type!r} needs base_url (or replicas, discover)")
        if self.type == "local" and self.base_url:
            raise ValueError("type 'local' takes no base_url: the gateway starts the engine")

    @property
    def read_timeout_s(self) -> float:
        assert self.read_timeout_ms is not None  # (set in __post_init__)
        return self.read_timeout_ms / 1000

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    @property
    def enabled(self) -> bool:
        return self.api_key_env is None or bool(self.api_key)


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    #: One JSON line per request on stdout.
    requests: bool = True


@dataclass(frozen=True)
class RateLimitConfig:
    """Where rate limits are counted (the limits themselves: the policy's
    ``[rate_limits]``)."""

    #: A Redis every replica shares, so they hold each key's limits jointly. Unset: the
    #: cache's Redis when ``cache.backend = "redis"``, else each process counts alone.
    redis_url: str | None = None
    #: As ``cache.redis_url_env``: the URL from this environment variable.
    redis_url_env: str | None = None
    #: Key prefix in Redis.
    prefix: str = "gwrl:"

    def __post_init__(self) -> None:
        if self.redis_url is not None or self.redis_url_env is not None:
            object.__setattr__(self, "redis_url",
                               checked_redis_url(self.redis_url, self.redis_url_env))


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    upstreams: dict[str, UpstreamConfig] = field(default_factory=dict)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    cache: CacheConfig = field(default_factory=CacheConfig)
    rate_limits: RateLimitConfig = field(default_factory=RateLimitConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    secret: SecretConfig = field(default_factory=SecretConfig)
    #: Where resumable streams are kept (issue 48; gateway.stream_store).
    streams: StreamsConfig = field(default_factory=StreamsConfig)
    #: OpenTelemetry traces (issue 49; gateway.tracing), off by default.
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: Set by load_config: the file, and the folder relative paths are resolved against.
    path: str = "<defaults>"
    root: str = "."

    @property
    def policy_path(self) -> Path:
        return Path(self.root) / self.server.policy


def load_config(path: str | Path) -> Config:
    """Load and validate a gateway config file.

    Raises ConfigError naming the file and key for unknown keys, bad values, and what
    :func:`gateway.model_config.check_models` refuses (models that name missing upstreams,
    names used twice, bad patterns and templates).
    """
    path = str(path)
    data = load_toml(path)
    for internal in ("path", "root"):
        if internal in data:
            raise ConfigError(path, internal, "unknown key")
    config = parse(Config, data, path)
    config = Config(
        server=config.server,
        auth=config.auth,
        logging=config.logging,
        upstreams=config.upstreams,
        models=config.models,
        cache=config.cache,
        rate_limits=config.rate_limits,
        responses=config.responses,
        secret=config.secret,
        streams=config.streams,
        tracing=config.tracing,
        path=path,
        root=str(Path(path).resolve().parent),
    )
    check_models(config.models, config.upstreams, path)
    return config
