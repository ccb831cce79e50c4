"""The embedder's ONNX Runtime path gives torch's vectors, and exports once per machine."""

from __future__ import annotations

import numpy as np
import pytest

from local_engine.embedder import Embedder

TEXTS = ["How do I reset my password?", "a much longer prompt about routing " * 40, "x"]


@pytest.fixture(scope="module")
def torch_embedder() -> Embedder:
    embedder = Embedder.load("torch")
    assert embedder.backend == "torch"
    return embedder


def test_onnx_export_matches_torch_and_is_reused(tmp_path, monkeypatch, torch_embedder):
    monkeypatch.setenv("GATEWAY_CACHE_DIR", str(tmp_path))
    onnx = Embedder.load("onnx")
    assert onnx.backend == "onnx"
    exported = list((tmp_path / "onnx").glob("*.onnx"))
    assert len(exported) == 1  # no temporary files left behind
    reference = torch_embedder(TEXTS)
    batch = onnx(TEXTS)  # padded batch
    assert batch.shape == (3, 384) and batch.dtype == np.float32
    assert np.linalg.norm(batch, axis=1) == pytest.approx(1.0, abs=1e-5)
    assert (batch * reference).sum(1).min() > 0.99999
    singles = np.concatenate([onnx([t]) for t in TEXTS])
    assert (singles * reference).sum(1).min() > 0.99999
    mtime = exported[0].stat().st_mtime_ns
    again = Embedder.load("onnx")  # from the file and the tokenizer: no torch weights
    assert again.backend == "onnx" and again.model is None
    assert exported[0].stat().st_mtime_ns == mtime  # loaded, not exported again
    assert (again.max_seq_length, again.dim) == (torch_embedder.max_seq_length, 384)
    texts = [*TEXTS, "routing " * 300]
    ids = again.tokenizer(texts, truncation=True, max_length=again.max_seq_length)["input_ids"]
    assert ids == torch_embedder.tokenizer(texts, truncation=True,
                                           max_length=256)["input_ids"]
    assert len(ids[-1]) == 256  # truncated as sentence-transformers does
    assert np.array_equal(again(TEXTS), batch)
