"""The provider simulator's parameters (:mod:`bench.provider_sim`): latency, limits, faults,
prices, each default with its unit and its public source.

Sources (every default below names one of these by its tag):

- [issue47] the issue's own latency model: TTFT = 300 ms + 0.25 ms per uncached input token,
  15 ms per output token, lognormal noise, 2% of TTFTs x8 (/work/notes/issue47.md).
- [oai-cache] OpenAI, Prompt caching guide,
  https://developers.openai.com/api/docs/guides/prompt-caching : "can reduce latency by up to
  80% and input token costs by up to 90%"; caching from 1024 tokens, hits in 128-token
  increments; routing by a hash of about the first 256 tokens (and ``prompt_cache_key``);
  entries kept 5-10 minutes idle; a prefix + key sent more than about 15 times a minute
  overflows to further machines (that figure as gateway/testing/cache_sim.py cites the same
  guide; the passage itself did not come up in this module's searches). The latency floor: the OpenAI cookbook "Prompt Caching 201",
  https://raw.githubusercontent.com/openai/openai-cookbook/main/examples/Prompt_Caching_201.ipynb
  ("up to 80%" of time to first token).
- [oai-price] OpenAI API pricing, https://developers.openai.com/api/docs/pricing (as quoted
  with openai.com/api/pricing by https://github.com/CommitBrief/commitbrief/wiki/Provider-OpenAI):
  gpt-4o $2.50 input / $1.25 cached input / $10.00 output per 1M tokens; gpt-4o-mini $0.15 /
  $0.075 / $0.60 (cached input half the input price on these models; no write fee).
- [ant-price] Anthropic pricing, https://platform.claude.com/docs/en/about-claude/pricing :
  5m cache writes 1.25x base input, 1h writes 2x, cache hits 0.1x; Sonnet 4.x $3 / $15,
  Haiku 4.5 $1 / $5 per 1M tokens (the table also summarised at
  https://docs.rs/synaps/0.10.2/synaps_cli/pricing/index.html).
- [aa] Artificial Analysis, https://artificialanalysis.ai/models/gpt-4o-2024-05-13/providers :
  OpenAI GPT-4o TTFT 0.39 s, 81 output tokens/s (medians); and the AA medians quoted at
  https://induwara.lk/tools/ai-llm-speed-comparison : GPT-4o 0.45 s / 131 t/s, Claude Sonnet
  4.6 0.74 s / 104 t/s. The issue's 300 ms base and 15 ms/token (67 t/s) sit in that range.
- [oai-limits] gpt-4o Tier 2: 5,000 RPM, 450,000 TPM; gpt-4o-mini Tier 2: 2,000,000 TPM
  (https://www.ai-buzz.com/ai-openai-rate-limits); TPM counts max_tokens at admission
  (https://community.openai.com/t/token-per-minute-rate-limit-for-gpt4-issues/360359/4).
- [ant-limits] Anthropic rate limits, https://docs.claude.com/zh-CN/api/rate-limits : RPM,
  ITPM and OTPM per model class, a token bucket refilled continuously, a 429 with
  ``retry-after``; only uncached input (``input_tokens`` + ``cache_creation_input_tokens``)
  counts toward ITPM, cache reads do not. Tier 2 Sonnet 4.x and Haiku 4.5: 1,000 RPM,
  450,000 ITPM, 90,000 OTPM (https://hivebook.wiki/wiki/anthropic-api-rate-limits, from
  docs.anthropic.com/en/api/rate-limits).
- [ant-529] 529 ``overloaded_error`` is the API overloaded for everyone, 429 is the account's
  own limit: https://learn.microsoft.com/en-us/microsoft-cloud/dev/dev-proxy/concepts/anthropic-529-overloaded-error
- [bench] a bench choice with no public figure behind it (fault rates, noise widths): stated
  as such, printed with the results.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, Literal

__all__ = ["DEFAULT_MODELS", "ModelSpec", "SimParams"]

Api = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class ModelSpec:
    """One model the simulator serves. Prices in USD per 1M tokens; limits per minute per
    (API key, model); ``base_ms``/``tpot_ms``: this model's own latency, None: the params'."""

    name: str
    api: Api
    input_usd: float  # uncached input
    cached_input_usd: float  # cache read (OpenAI cached_tokens, Anthropic cache hits)
    output_usd: float
    cache_write_5m_usd: float = 0.0  # Anthropic 5m writes (OpenAI: no write fee, [oai-price])
    cache_write_1h_usd: float = 0.0  # Anthropic 1h writes
    rpm: int = 0  # requests per minute; 0: unlimited
    tpm: int = 0  # OpenAI: input + max_tokens per minute at admission; 0: unlimited
    itpm: int = 0  # Anthropic: uncached input + cache writes per minute; 0: unlimited
    otpm: int = 0  # Anthropic: output per minute (max_tokens at admission, then actual)
    base_ms: float | None = None
    tpot_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Raises ValueError for an unknown key or a missing required one
        (TypeError: not an object)."""
        _check_keys(cls, d, "model")
        return cls(**d)


def _openai(name: str, inp: float, cached: float, out: float, rpm: int, tpm: int) -> ModelSpec:
    return ModelSpec(name, "openai", inp, cached, out, rpm=rpm, tpm=tpm)


def _anthropic(name: str, inp: float, out: float, rpm: int, itpm: int, otpm: int) -> ModelSpec:
    # [ant-price]: reads 0.1x, 5m writes 1.25x, 1h writes 2x the base input price
    return ModelSpec(name, "anthropic", inp, inp * 0.1, out, inp * 1.25, inp * 2.0,
                     rpm=rpm, itpm=itpm, otpm=otpm)


#: The models served by default: the workload's two ([oai-price], [ant-price]), Sonnet 4.6,
#: and a cheaper one per API (what a routing stage may pick). Limits: Tier 2 ([oai-limits], [ant-limits]).
DEFAULT_MODELS: tuple[ModelSpec, ...] = (
    _openai("gpt-4o", 2.50, 1.25, 10.00, rpm=5_000, tpm=450_000),
    _openai("gpt-4o-mini", 0.15, 0.075, 0.60, rpm=5_000, tpm=2_000_000),
    _anthropic("claude-sonnet-4-5", 3.00, 15.00, rpm=1_000, itpm=450_000, otpm=90_000),
    # the anthropic SDK warns that 4-5 is deprecated (end of life 2026-11-30); same prices
    _anthropic("claude-sonnet-4-6", 3.00, 15.00, rpm=1_000, itpm=450_000, otpm=90_000),
    _anthropic("claude-haiku-4-5", 1.00, 5.00, rpm=1_000, itpm=450_000, otpm=90_000),
)


@dataclass(frozen=True)
class SimParams:
    """Every knob of the simulator (module docstring for the sources). Times in ms unless the
    name says s; shares are probabilities in [0, 1] drawn per request from a seeded RNG."""

    seed: int = 0
    # -- latency: TTFT = (base_ms + ms_per_uncached_token * uncached
    #                     + ms_per_cached_token * cached) * lognormal(0, ttft_sigma),
    #    times tail_factor for a tail_share of requests ([issue47])
    base_ms: float = 300.0  # [issue47]; [aa]: 0.39-0.74 s medians incl. network
    ms_per_uncached_token: float = 0.25  # [issue47]
    # A fully cached 100k-token prompt answers 79% sooner than an uncached one: the "up to
    # 80%" of [oai-cache] (0.05 = a fifth of the uncached cost per token).
    ms_per_cached_token: float = 0.05
    ttft_sigma: float = 0.25  # lognormal sigma of the TTFT noise (median 1) [bench]
    tail_share: float = 0.02  # [issue47]
    tail_factor: float = 8.0  # [issue47]
    tpot_ms: float = 15.0  # per output token, steady: 67 t/s [issue47]; [aa] 81-131 t/s
    tpot_sigma: float = 0.05  # lognormal sigma of a request's pace (small, steady) [bench]
    # -- answers: n output tokens drawn from a hash of (model, prompt, seed), cut by max_tokens
    out_min: int = 20  # [bench]
    out_max: int = 300  # [bench]
    # -- prompt caching ([oai-cache]; Anthropic rules in gateway/testing/cache_sim.py)
    openai_machines: int = 8  # cache machines per organisation (API key) [bench]
    openai_cache_ttl_s: float = 300.0  # the guide's 5-10 min idle, the short end [oai-cache]
    openai_overflow_per_min: int = 15  # prefix+key rate before spilling [oai-cache]
    # -- rate limits (per model in ModelSpec): the bucket refills over this window
    limit_window_s: float = 60.0  # "per minute" [oai-limits], [ant-limits]
    # -- faults, each a share of admitted requests [bench]
    fault_500: float = 0.005  # 500 api_error / server_error
    fault_overloaded: float = 0.005  # Anthropic 529 overloaded_error [ant-529]; OpenAI 503
    fault_stall: float = 0.01  # a stall: TTFT x stall_factor, or a pause mid-stream
    stall_factor: float = 8.0  # [bench] (as the heavy tail)
    stall_midstream_share: float = 0.5  # share of stalls that pause mid-stream
    stall_pause_ms: float = 5_000.0  # [bench]
    fault_cut: float = 0.005  # streams dropped after k chunks, no terminal event
    error_delay_ms: float = 50.0  # how long a 500/529 takes to come back [bench]
    models: tuple[ModelSpec, ...] = field(default=DEFAULT_MODELS)

    def model(self, name: str) -> ModelSpec | None:
        """The served model of that name, or None."""
        return next((m for m in self.models if m.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """Every parameter, JSON-ready (printed with the results)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "models"}
        out["models"] = [m.to_dict() for m in self.models]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SimParams:
        """Defaults overridden by ``d`` (``models``: the whole list). Raises ValueError for an
        unknown key."""
        _check_keys(cls, d, "param", required=False)
        models = d.get("models")
        given = {k: v for k, v in d.items() if k != "models"}
        out = replace(cls(), **given)
        if models is not None:
            out = replace(out, models=tuple(ModelSpec.from_dict(m) for m in models))
        return out


def _check_keys(cls: type, d: dict[str, Any], what: str, required: bool = True) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"{what}: expected an object, got {type(d).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; allowed: {sorted(names)}")
    if required:
        missing = [f.name for f in fields(cls) if f.name not in d
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"{what}: missing {missing}")


#: ``bench/workload.py --faults NAME``: fault mixes over the defaults. ``issue48``: issue 48's
#: (2% 500s, 1% streams cut after a random token, 1% stalls: a 20 s pause mid-answer).
FAULTS: dict[str, dict[str, float]] = {
    "issue48": {"fault_500": 0.02, "fault_overloaded": 0.0, "fault_cut": 0.01,
                "fault_stall": 0.01, "stall_midstream_share": 1.0, "stall_pause_ms": 20_000.0},
}
