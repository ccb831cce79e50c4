"""The Chat Completions fields no other provider's API has an equivalent for, as the
translators from OpenAI chat (to Anthropic, to Gemini) refuse them: the feature a 400 names,
and which values change nothing (None always changes nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NO_EQUIVALENT", "never"]


def never(value: Any) -> bool:
    """No value of the field is harmless: any is refused."""
    return False


NO_EQUIVALENT: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "n": ("'n' > 1", lambda v: v == 1),
    "logprobs": ("'logprobs'", lambda v: v is False),
    "top_logprobs": ("'top_logprobs'", lambda v: v == 0),
    "logit_bias": ("'logit_bias'", lambda v: not v),
    "audio": ("audio output ('audio')", never),
    "modalities": ("audio output ('modalities')",
                   lambda v: isinstance(v, list) and "audio" not in v),
    "prediction": ("predicted outputs ('prediction')", never),
    "reasoning_effort": ("'reasoning_effort'", never),
    "web_search_options": ("'web_search_options'", never),
    "moderation": ("'moderation'", never),
    "verbosity": ("'verbosity' other than \"medium\"", lambda v: v == "medium"),
    "functions": ("legacy 'functions' (use 'tools')", never),
    "function_call": ("legacy 'function_call' (use 'tool_choice')", never),
}
