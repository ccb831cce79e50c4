"""Token counters for the compression budget: a callable from text to a token count.

The budget is counted in the upstream's tokenizer where the gateway has it: o200k_base
(OpenAI's GPT-4o family, through the ``bpe-openai`` package, Rust, no download) or the
local engine's own; :func:`estimate` (UTF-8 bytes / 4, rounded up) where it has none.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CountTokens", "estimate", "o200k", "tokenizer_file"]

#: ``count(text)`` -> tokens (int >= 0).
CountTokens = Callable[[str], int]


def estimate(text: str) -> int:
    """UTF-8 bytes / 4, rounded up: OpenAI's rule of thumb for English text."""
    return -(-len(text.encode()) // 4)


@functools.cache
def _encoding() -> Any:
    with warnings.catch_warnings():  # it reads its data with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        return bpe_openai.get_encoding("o200k_base")


def o200k() -> CountTokens:
    """A counter in o200k_base (loaded once per process, 1-2 s; then about 1 ms per
    1,000 tokens on one core). Special tokens in the text count as plain text."""
    encoding = _encoding()

    def count(text: str) -> int:
        return len(encoding.encode(text, disallowed_special=()))

    return count


@functools.cache
def tokenizer_file(path: Path) -> CountTokens:
    """A counter in a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library, Rust;
    loaded once per path, about 0.1 s). Raises OSError when the file is missing or
    unreadable."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a bad file
        raise OSError(f"cannot load the tokenizer {path}: {exc}") from exc

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
