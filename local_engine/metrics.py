"""The engine's Prometheus metrics (served at the engine's /metrics), on their own registry.

Histograms are observed on the engine thread once per step or per finished request; gauges
read the scheduler and block manager when scraped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from local_engine.sequence import Sequence

if TYPE_CHECKING:
    from local_engine.engine import Engine

__all__ = ["EngineMetrics"]

_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


class EngineMetrics:
    def __init__(self, engine: Engine | None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_wait = Histogram("engine_queue_wait_ms", "Arrival to admission (ms)",
                                    buckets=_MS, registry=r)
        self.ttft = Histogram("engine_ttft_ms", "Arrival to first token (ms)", buckets=_MS,
                              registry=r)
        self.tpot = Histogram("engine_tpot_ms", "Mean time per output token after the first "
                              "(ms)", buckets=(5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000),
                              registry=r)
        self.batch_size = Histogram("engine_step_batch_size", "Sequences per step",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.step_tokens = Histogram("engine_step_tokens", "Tokens computed per step",
                                     buckets=(1, 4, 16, 64, 128, 256, 512, 1024, 2048),
                                     registry=r)
        self.step_ms = Histogram("engine_step_ms", "Wall time of one step (ms)", buckets=_MS,
                                 registry=r)
        self.generated = Counter("engine_generated_tokens", "Output tokens", registry=r)
        self.prompt_tokens = Counter("engine_prompt_tokens", "Prompt tokens of finished "
                                     "requests", registry=r)
        self.cached_tokens = Counter("engine_prompt_cached_tokens", "Prompt tokens served from "
                                     "the prefix cache", registry=r)
        self.finished = Counter("engine_requests_finished", "Finished requests by reason",
                                ["reason"], registry=r)
        self.aborted = Counter("engine_requests_aborted", "Requests cancelled by their client",
                               registry=r)
        self.spec_drafts = Counter("engine_spec_drafts", "Drafts verified (speculative "
                                   "decoding)", registry=r)
        self.spec_draft_tokens = Counter("engine_spec_draft_tokens", "Draft tokens verified",
                                         registry=r)
        self.spec_accepted = Counter("engine_spec_accepted_tokens", "Draft tokens accepted",
                                     registry=r)
        self.spec_accepted_at = Counter("engine_spec_accepted_tokens_by_position",
                                        "Drafts whose token at this position (1 = first) "
                                        "was accepted", ["position"], registry=r)
        self.embed_batch = Histogram("engine_embed_batch_size", "Texts per embedding batch",
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        if engine is not None:
            gauges = {
                "engine_running_seqs": ("Sequences running", lambda: len(
                    engine.scheduler.running)),
                "engine_waiting_seqs": ("Sequences waiting", lambda: len(
                    engine.scheduler.waiting)),
                "engine_kv_blocks_used": ("KV blocks in use", lambda: engine.blocks.num_used),
                "engine_kv_blocks_free": ("KV blocks free or cached",
                                          lambda: engine.blocks.num_free),
                "engine_prefix_cache_hit_rate": ("Share of prompt tokens from the prefix cache",
                                                 lambda: engine.blocks.hit_rate),
                "engine_preemptions": ("Sequences preempted so far", lambda:
                                       engine.scheduler.num_preempted),
                "engine_spec_acceptance_length": (("Mean tokens a decoding sequence gains "
                                                   "per step, over all steps (1 without "
                                                   "speculation)"),
                                                  lambda: engine.acceptance_length),
            }
            for name, (doc, fn) in gauges.items():
                Gauge(name, doc, registry=r).set_function(fn)

    def observe_step(self, engine: Engine) -> None:
        last = engine.last
        if last.num_seqs:
            self.batch_size.observe(last.num_seqs)
            self.step_tokens.observe(last.num_tokens)
            self.step_ms.observe(last.ms)
        if last.drafts:
            self.spec_drafts.inc(last.drafts)
            self.spec_draft_tokens.inc(last.draft_tokens)
            self.spec_accepted.inc(last.accepted)
            for j, n in enumerate(last.accepted_at):
                if n:
                    self.spec_accepted_at.labels(str(j + 1)).inc(n)

    def observe_finished(self, seq: Sequence, now: float) -> None:
        n = len(seq.output_ids)
        self.generated.inc(n)
        self.prompt_tokens.inc(len(seq.prompt_ids))
        self.cached_tokens.inc(seq.num_cached)
        self.finished.labels(seq.finish_reason or "unknown").inc()
        if seq.admitted_at is not None:
            self.queue_wait.observe((seq.admitted_at - seq.arrived) * 1e3)
        if seq.first_token_at is not None:
            self.ttft.observe((seq.first_token_at - seq.arrived) * 1e3)
            if n > 1:
                self.tpot.observe((now - seq.first_token_at) * 1e3 / (n - 1))
