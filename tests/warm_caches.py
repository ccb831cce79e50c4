"""What a fresh machine computes once and caches, done in a process of its own while the
suite's first tests (in-process, on one core) run: SmolLM2 converted from its GGUF into the
cache folder, all-MiniLM-L6-v2 exported to ONNX there, and the bytecode of the heavy
packages (torch, transformers, sentence-transformers) written. Otherwise the first test
needing each does it on the suite's critical path. Every step is safe to race: conversion
and export write to a temporary path and rename, bytecode is written atomically.

    python -m tests.warm_caches
"""

from __future__ import annotations

from local_engine.paths import DEFAULT_MODEL, cache_dir, converted


def cold() -> bool:
    """Whether anything here is missing from the cache folder (an ONNX file exported for
    other package versions counts as there: telling would import torch here)."""
    return converted(DEFAULT_MODEL) is None or not any(
        (cache_dir() / "onnx").glob("*.onnx"))


def main() -> None:
    import sentence_transformers  # noqa: F401 - its bytecode, for the export and the tests

    from local_engine.embedder import Embedder
    from local_engine.loader import resolve

    resolve(DEFAULT_MODEL)
    Embedder.load()


if __name__ == "__main__":
    main()
    print(f"caches warm in {cache_dir()}")
