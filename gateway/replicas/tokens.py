"""The engine's own block hashes of a chat request, computed in the gateway: its chat
template and tokenizer (:func:`local_engine.openai_format.encode_chat`), then the block
manager's hash chain (:func:`local_engine.block_manager.block_hashes`). llm-d's precise
prefix-cache scorer tokenizes in the router the same way, to look the blocks up in the
index the engines' KV events feed. Loaded only by a ``prefix_precise`` pool."""

from __future__ import annotations

from typing import Any

__all__ = ["EngineKeys"]


class EngineKeys:
    """``keys(body, block_size)`` -> the block hashes the engine registers for this chat
    request's prompt (empty when the engine would refuse it). ``model``: as the engine's
    ``--model`` ("smollm2", a folder, a GGUF file); loading raises FileNotFoundError when it
    is not on this machine."""

    def __init__(self, model: str) -> None:
        from transformers import AutoTokenizer

        from local_engine.paths import converted

        folder = converted(model)
        if folder is None:  # a GGUF not converted on this machine yet: convert it once
            from local_engine.loader import resolve

            folder = resolve(model)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)

    def keys(self, body: Any, block_size: int) -> list[int]:
        from local_engine.block_manager import block_hashes
        from local_engine.errors import EngineError
        from local_engine.openai_format import encode_chat, parse_chat

        try:
            chat = parse_chat(body, 1)
            return block_hashes(encode_chat(self.tokenizer, chat.messages, chat.continue_final),
                                block_size)
        except (EngineError, ValueError):
            return []
