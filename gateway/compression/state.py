"""What the ``compress`` stage learns and keeps across policy reloads: each model's prefill
rate, the compressor's own speed, token counters per upstream, and the embedding function
once it is loaded."""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from gateway.compression.gate import CompressorRate, PrefillRate
from gateway.compression.tokens import CountTokens, estimate, o200k, tokenizer_file
from gateway.embedding import Embed

__all__ = ["CompressionState"]

log = structlog.get_logger("gateway.compression")


class CompressionState:
    """``embed``: all-MiniLM-L6-v2 (None until loaded: ranking is lexical until then)."""

    def __init__(self, embed: Embed | None = None) -> None:
        self.embed = embed
        self._prefill: dict[str, PrefillRate] = {}
        self._compressor: dict[bool, CompressorRate] = {}
        self._counters: dict[str, CountTokens] = {}
        self._warmed = False

    def warm(self) -> None:
        """Load o200k_base on a thread (1-2 s, once), so the first compressed request does
        not wait for it on the event loop."""
        if not self._warmed:
            self._warmed = True
            threading.Thread(target=o200k, name="o200k-load", daemon=True).start()

    def prefill(self, model: str) -> PrefillRate:
        """The learned prefill rate of a public model name."""
        rate = self._prefill.get(model)
        if rate is None:
            rate = self._prefill[model] = PrefillRate()
        return rate

    def compressor(self, prior_ms_per_1k: float, fine: bool = False) -> CompressorRate:
        """The compressor's measured speed, starting from the policy's prior; ``fine``: with
        the fine pass's scoring call (a rate of its own)."""
        rate = self._compressor.get(fine)
        if rate is None:
            rate = self._compressor[fine] = CompressorRate(prior_ms_per_1k)
        return rate

    def counter(self, upstream: str, api: str, engine_model: str | None) -> CountTokens:
        """Tokens as the upstream counts them: a local engine's own tokenizer (once its
        model folder exists), o200k_base for other OpenAI-compatible upstreams, else an
        estimate (UTF-8 bytes / 4)."""
        count = self._counters.get(upstream)
        if count is not None:
            return count
        count = estimate
        if engine_model is not None:
            folder = _engine_folder(engine_model)
            if folder is None:  # not converted yet: estimate, and look again next time
                return o200k()
            try:
                count = tokenizer_file(folder / "tokenizer.json")
            except OSError as exc:
                log.warning("compression_tokenizer_unreadable", error=str(exc),
                            fallback="o200k_base")
                count = o200k()
        elif api == "openai":
            count = o200k()
        self._counters[upstream] = count
        return count


def _engine_folder(model: str) -> Path | None:
    from local_engine.paths import converted  # the tokenizer's file only, no model load

    return converted(model)
