"""The token counts of an answer, in no wire format: what the upstream's usage object says.

Read once per request by whoever reads the upstream's answer (dispatch for a whole answer,
the endpoint for a stream, the cache stage for a hit) into ``RequestContext.usage``; the
stages that need the counts (rate-limit settlement, compression's learning, the cache
store) read them there, and the log line is written from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Usage"]


class Usage(NamedTuple):
    """Token counts (each None when the upstream did not say). ``prompt_tokens`` counts all
    input, the prompt-cache reads and writes included, whatever the API; ``cached_tokens``:
    the prompt tokens read from the provider's prompt cache; ``cache_write_tokens``: those
    written to it (Anthropic reports them; OpenAI does not). (A tuple: one per request, made
    cheaply.)"""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None

    @classmethod
    def of(cls, usage: dict[str, Any] | None) -> Usage | None:
        """The counts of a usage object, OpenAI's (Chat Completions, or Responses: told by
        ``input_tokens_details``) or Anthropic's (``input_tokens`` without details: it
        excludes the cache reads and writes, which are added so that ``prompt_tokens``
        counts all input either way); None for none (or ``{}``)."""
        if not usage:
            return None
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):  # OpenAI Responses: input_tokens counts the reads
            return cls(usage.get("input_tokens"), usage.get("output_tokens"),
                       details.get("cached_tokens"))
        if "input_tokens" in usage:
            read = usage.get("cache_read_input_tokens")
            written = usage.get("cache_creation_input_tokens")
            return cls((usage.get("input_tokens") or 0) + (read or 0) + (written or 0),
                       usage.get("output_tokens"), read, written)
        details = usage.get("prompt_tokens_details")
        return cls(usage.get("prompt_tokens"), usage.get("completion_tokens"),
                   details.get("cached_tokens") if isinstance(details, dict) else None)

    @property
    def spent(self) -> int | None:
        """Prompt plus completion tokens; None when the usage gives neither."""
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)
