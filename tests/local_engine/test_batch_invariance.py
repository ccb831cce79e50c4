"""On a CPU the engine's forward pass is batch-invariant at the tiny model's shapes: greedy
outputs in bfloat16 are the same whether a prompt runs alone or beside others (chunked
prefill and preemption in play), and the attention's rows do not depend on the rows beside
them or on the keys' padding. (At SmolLM2's shapes oneDNN's bf16 projections are not; see
local_engine.model.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from local_engine.engine import Engine
from local_engine.model import invariant_attention
from local_engine.sequence import SamplingParams
from tests.local_engine.conftest import Mode


def prompts(count: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(2, 96, (5 + 7 * i,), generator=g).tolist() for i in range(count)]


def greedy(engine: Engine, batch: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    seqs = [engine.add(p, params) for p in batch]
    while engine.has_work():
        engine.step()
    return [s.output_ids for s in seqs]


def test_bfloat16_greedy_outputs_do_not_depend_on_the_batch(
        make_engine: Callable[..., Engine], engine_device: torch.device,
        engine_mode: Mode) -> None:
    if engine_device.type == "cuda":
        pytest.skip("batch invariance is a property of the CPU path")
    if not engine_mode.batch_invariant:
        pytest.skip(f"{engine_mode.name}: not batch-invariant (local_engine.quantize)")
    ps = prompts(8)
    alone = [greedy(make_engine(torch.bfloat16), [p])[0] for p in ps]
    # 8 at a time, prompts prefilled in chunks of 16 tokens, KV for about 4 of them
    busy = make_engine(torch.bfloat16, max_num_seqs=8, max_batch_tokens=16, num_blocks=60)
    together = greedy(busy, ps)
    assert busy.scheduler.num_preempted > 0
    assert together == alone


def rows_at(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            last: torch.Tensor) -> torch.Tensor:
    """Rows of q [R, D] attending causally (row i sees keys up to last[i]) to k, v [L, D]."""
    visible = torch.arange(k.shape[0])[None, :] <= last[:, None]
    return invariant_attention(q[None, None], k[None, None], v[None, None],
                               visible[None, None])[0, 0]


@pytest.mark.parametrize("rows", [2, 3, 5, 17, 40])
def test_attention_rows_are_bit_identical_alone_batched_and_padded(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    q, k, v = (torch.randn(n, 64, generator=g).bfloat16() for n in (rows, 600, 600))
    last = torch.arange(300, 300 + rows)
    together = rows_at(q, k[:512], v[:512], last)
    for i in range(rows):
        alone = rows_at(q[i:i + 1], k[:512], v[:512], last[i:i + 1])
        assert torch.equal(together[i], alone[0])
    # more keys (past every row's last): the same sums; L not a multiple of the chunk too
    assert torch.equal(rows_at(q, k, v, last), together)


def test_attention_agrees_with_sdpa() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 32, generator=g, dtype=torch.float32)
    k, v = (torch.randn(2, 3, 300, 32, generator=g, dtype=torch.float32) for _ in range(2))
    visible = torch.arange(300) <= torch.tensor([40, 299])[:, None, None, None]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    assert torch.allclose(invariant_attention(q, k, v, visible, chunk=128), expected,
                          atol=1e-5)
