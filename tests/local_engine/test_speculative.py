"""N-gram speculative decoding on the tiny random Llama: the same outputs as without it
(prefix cache, chunked prefill and preemption in play), the rejection sampler's output
distribution against the target, ends inside an accepted run, what the prefix cache keeps,
and when speculation switches itself off."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest
import torch

from local_engine.cuda_graphs import DecodeGraphs
from local_engine.engine import Engine
from local_engine.sampling import target_probs
from local_engine.sequence import SamplingParams, Sequence
from local_engine.speculative import DraftState, NgramProposer, SpecConfig, StepCost, verify

SPEC = SpecConfig(num_tokens=4, min_n=2, max_n=4, max_batch_size=8)


def looping_prompts(count: int, seed: int, shared: int = 0) -> list[list[int]]:
    """Prompts that repeat a short phrase (the model tends to continue it, so drafts get
    accepted), some longer than a prefill chunk, the first ``shared`` tokens common."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(2, 96, (shared,), generator=g).tolist()
    out = []
    for i in range(count):
        phrase = torch.randint(2, 96, (3 + i % 5,), generator=g).tolist()
        tail = torch.randint(2, 96, (i % 4,), generator=g).tolist()
        out.append(common + phrase * (2 + i % 4) + tail)
    return out


def run_all(engine: Engine, prompts: list[list[int]],
            params: SamplingParams) -> tuple[list[Sequence], list[str]]:
    seqs = [engine.add(p, params) for p in prompts]
    texts = [""] * len(seqs)
    while engine.has_work():
        for out in engine.step():
            texts[seqs.index(out.seq)] += out.text
    return seqs, texts


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["default", "bfloat16"])
def test_greedy_outputs_are_identical_with_and_without_speculation(
        make_engine: Callable[..., Engine], batch: int, engine_dtype: torch.dtype,
        engine_device: torch.device, dtype: torch.dtype | None, batch_invariant: bool) -> None:
    dtype = dtype or engine_dtype
    if batch > 1 and not batch_invariant:
        # at batch 1 every decode and verification is a product of at most 9 rows, which
        # INT8 weights compute with their row-invariant kernel: lossless there
        pytest.skip("a mixed step takes the INT8 weights' dense path (local_engine.quantize)")
    if dtype != torch.float32 and engine_device.type == "cuda":
        # On CUDA, verifying 1 + k queries runs other kernels than decoding one, and in
        # bfloat16 their rounding differs enough to flip near-ties (seen on an H200 at
        # batch 8 after 31 tokens); on a CPU the forward pass is batch-invariant.
        pytest.skip("greedy ties flip between matrix shapes in bfloat16 on CUDA")
    prompts = looping_prompts(16, seed=batch, shared=9)
    prompts += prompts[:4]  # the same prompts again: whole-prompt prefix-cache hits
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    # 70 blocks of 4 tokens hold about 4 of these sequences: 8 at a time must preempt
    kw = {"max_num_seqs": batch, "max_batch_tokens": 16, "num_blocks": 70}
    plain = make_engine(dtype, **kw)
    spec = make_engine(dtype, speculative=SPEC, **kw)
    expected, expected_text = run_all(plain, prompts, params)
    got, got_text = run_all(spec, prompts, params)
    assert [s.output_ids for s in got] == [s.output_ids for s in expected]
    assert got_text == expected_text
    # drafts were accepted, often several at once (INT8 weights, the one mode that is not
    # batch-invariant, greedy-decode these prompts into less repetitive answers: fewer)
    assert spec.acceptance_length > (1.5 if batch_invariant else 1.0)
    assert spec.blocks.hits > 0  # prefix-cache hits served some prompts
    if batch > 1:
        assert spec.scheduler.num_preempted > 0
    assert spec.blocks.num_used == 0


def test_rejection_sampling_gives_the_target_distribution() -> None:
    """Every position of a 2-token draft, 60k draws: the first token is distributed as p0;
    after an accepted draft token, the next as p1, then p2 (the bonus)."""
    torch.manual_seed(0)
    vocab, draws = 6, 60_000
    logits = torch.randn(3, vocab) * 1.5
    params = SamplingParams(temperature=0.8, top_p=0.95)
    p = target_probs(logits, torch.full((3,), 0.8), torch.full((3,), 0.95))
    draft = [int(p[0].argsort()[-2]), int(p[1].argmax())]  # a likely, not the likeliest
    out = verify(logits.repeat(draws, 1), [(3 * i, 3) for i in range(draws)],
                 [draft] * draws, [params] * draws, [None] * draws)

    def tv(samples: list[int], target: torch.Tensor) -> float:
        counts = torch.bincount(torch.tensor(samples), minlength=vocab).float()
        return float((counts / counts.sum() - target).abs().sum() / 2)

    first = [o[0] for o in out]
    second = [o[1] for o in out if o[0] == draft[0]]
    third = [o[2] for o in out if o[:2] == draft]
    assert min(len(second), len(third)) > 10_000
    assert tv(first, p[0]) < 0.02
    assert tv(second, p[1]) < 0.02
    assert tv(third, p[2]) < 0.02


def test_greedy_verification_keeps_drafts_while_they_are_the_argmax() -> None:
    logits = torch.zeros(4, 5)
    for row, tok in enumerate([3, 1, 4, 2]):
        logits[row, tok] = 1.0
    greedy = SamplingParams(temperature=0)
    assert verify(logits, [(0, 4)], [[3, 1, 0]], [greedy], [None]) == [[3, 1, 4]]
    assert verify(logits, [(0, 4)], [[3, 1, 4]], [greedy], [None]) == [[3, 1, 4, 2]]
    assert verify(logits, [(0, 4)], [[0, 1, 4]], [greedy], [None]) == [[3]]


def run_tracking_cut(engine: Engine, prompt: list[int],
                     params: SamplingParams) -> tuple[Sequence, str, bool]:
    """Run one request; also whether its last step verified tokens past the end (dropped)."""
    seq = engine.add(prompt, params)
    text, before = "", 0
    while engine.has_work():
        before = len(seq.output_ids)
        for out in engine.step():
            text += out.text
    return seq, text, len(seq.output_ids) - before < engine.last.decode_tokens


class Oracle:
    """A fake proposer that drafts the next tokens of a known greedy output: every draft is
    accepted, so ends fall anywhere inside accepted runs (the n-gram proposer's drafts copy
    earlier tokens, so a token's first appearance rarely sits inside a run)."""

    def __init__(self, expected: list[int], k: int = 4):
        self.expected, self.k = expected, k

    def active(self, num_decoding: int) -> bool:
        return True

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        done = len(seq.output_ids)
        return self.expected[done:done + min(self.k, limit)]

    def select(self, drafts: list[tuple[Sequence, list[int]]], decoding: int
               ) -> list[list[int]]:
        return [d for _, d in drafts]

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        assert accepted == proposed

    def observe_step(self, tokens: int, ms: float) -> None:
        pass


@pytest.mark.parametrize("end", ["eos", "stop", "max_tokens", "max_model_len"])
def test_an_end_inside_an_accepted_run_is_where_plain_decoding_ends(
        make_engine: Callable[..., Engine], end: str) -> None:
    """Per end, both proposers (n-gram, and an oracle whose drafts are all accepted) against
    the same plain decoding, run once per case."""
    prompt = looping_prompts(3, seed=5)[2]
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    (ref,), (ref_text,) = run_all(make_engine(), [prompt], free)
    cases: list[tuple[SamplingParams, dict[str, int], set[int] | None]] = []
    for at in range(3, 30, 2):  # ends at many places, so that some fall inside a run
        if end == "eos":
            cases.append((SamplingParams(temperature=0, max_tokens=40), {},
                          {ref.output_ids[at]}))
        elif end == "stop":
            cases.append((SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                         stop=(ref_text[at:at + 2],)), {}, None))
        elif end == "max_tokens":
            cases.append((SamplingParams(temperature=0, max_tokens=at, ignore_eos=True), {},
                          None))
        else:
            cases.append((free, {"max_model_len": len(prompt) + at}, None))
    cut = dict.fromkeys(("ngram", "oracle"), 0)
    gained = dict.fromkeys(("ngram", "oracle"), 0)
    steps = dict.fromkeys(("ngram", "oracle"), 0)
    for params, kw, eos in cases:
        engine = make_engine(**kw)
        if eos is not None:
            engine.eos = eos
        seq, text, _ = run_tracking_cut(engine, prompt, params)
        plain = (seq.output_ids, text, seq.finish_reason)
        for proposer in ("ngram", "oracle"):
            engine = make_engine(speculative=SPEC, **kw)
            if proposer == "oracle":
                engine.scheduler.proposer = Oracle(ref.output_ids)
            if eos is not None:
                engine.eos = eos
            seq, text, dropped = run_tracking_cut(engine, prompt, params)
            assert (seq.output_ids, text, seq.finish_reason) == plain, proposer
            gained[proposer] += engine.decode_tokens
            steps[proposer] += engine.decodes
            cut[proposer] += dropped
    for proposer in ("ngram", "oracle"):
        assert gained[proposer] / steps[proposer] > 1.5, proposer  # accepted runs the rule
    if end in ("eos", "stop"):
        assert cut["oracle"] > 0  # some ended inside a run, the tokens after the end dropped


def test_only_verified_tokens_enter_the_prefix_cache(
        make_engine: Callable[..., Engine], batch_invariant: bool) -> None:
    engine = make_engine(speculative=SpecConfig(num_tokens=6, min_n=1, max_n=3))
    prompts = looping_prompts(6, seed=7)
    seqs, _ = run_all(engine, prompts, SamplingParams(temperature=0, max_tokens=30,
                                                      ignore_eos=True))
    bs = engine.blocks.block_size
    verified: set[int] = set()
    for seq in seqs:
        ids, h = seq.token_ids, 0
        for i in range(len(ids) // bs):
            h = hash((h, tuple(ids[i * bs:(i + 1) * bs])))
            verified.add(h)
    assert engine.blocks.by_hash and set(engine.blocks.by_hash) <= verified
    # A continuation reuses those blocks and gets what a cold engine computes.
    follow = seqs[0].token_ids + [5, 6]
    warm = engine.add(follow, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert warm.num_cached >= len(seqs[0].token_ids) // bs * bs - bs
    cold = make_engine()
    (again,), _ = run_all(cold, [follow], SamplingParams(temperature=0, max_tokens=12,
                                                         ignore_eos=True))
    assert not batch_invariant or warm.output_ids == again.output_ids


def test_speculation_is_skipped_in_steps_with_a_large_batch(
        make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(speculative=SpecConfig(max_batch_size=4), max_num_seqs=8)
    prompts = looping_prompts(6, seed=3)
    seqs = [engine.add(p, SamplingParams(temperature=0, max_tokens=8 + 6 * i,
                                         ignore_eos=True)) for i, p in enumerate(prompts)]
    steps = []
    while engine.has_work():
        engine.step()
        steps.append((engine.last.decodes, engine.last.drafts))
    assert all(drafts == 0 for decodes, drafts in steps if decodes > 4)
    assert sum(drafts for decodes, drafts in steps if decodes <= 4) > 0
    # the first two (finished before the batch got small) never even looked for drafts
    assert seqs[0].draft is None and seqs[1].draft is None


def test_a_sequence_whose_drafts_fail_stops_drafting(
        make_engine: Callable[..., Engine]) -> None:
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(2, 96, (60,), generator=g).tolist()  # repeats only by chance
    params = SamplingParams(temperature=1.0, max_tokens=60, ignore_eos=True, seed=1)
    counts = []
    for min_acceptance in (0.0, 0.9):
        engine = make_engine(speculative=SpecConfig(min_n=1, max_n=2,
                                                    min_acceptance=min_acceptance,
                                                    pause_steps=1000))
        engine.add(prompt, params)
        drafts = 0
        while engine.has_work():
            engine.step()
            drafts += engine.last.drafts
        counts.append(drafts)
    assert counts[0] > 5  # 1-gram matches in random text: many drafts, mostly rejected
    assert counts[1] < counts[0]


def test_seeded_sampling_with_speculation_is_reproducible(
        make_engine: Callable[..., Engine]) -> None:
    prompt = looping_prompts(4, seed=2)[3]
    params = SamplingParams(temperature=0.3, max_tokens=30, ignore_eos=True, seed=4)
    outs = []
    for _ in range(2):
        engine = make_engine(speculative=SPEC)
        (seq,), _ = run_all(engine, [prompt], params)
        outs.append(seq.output_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 30


def test_config_rejects_unknown_keys_and_methods() -> None:
    assert SpecConfig.from_dict({"method": "ngram", "num_tokens": 3}).num_tokens == 3
    with pytest.raises(ValueError, match="unknown speculative key 'k'"):
        SpecConfig.from_dict({"k": 3})
    with pytest.raises(ValueError, match="not supported"):
        SpecConfig.from_dict({"method": "eagle"})


def test_draft_positions_count_accepted_tokens(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(speculative=SPEC)
    engine.add(looping_prompts(2, seed=4)[1], SamplingParams(temperature=0, max_tokens=30,
                                                             ignore_eos=True))
    accepted_at = [0] * SPEC.num_tokens
    total = 0
    while engine.has_work():
        engine.step()
        total += engine.last.accepted
        for j, n in enumerate(engine.last.accepted_at):
            accepted_at[j] += n
    assert sum(accepted_at) == total > 0
    assert all(a >= b for a, b in pairwise(accepted_at))  # position j+1 needs j


@pytest.mark.parametrize("spec", [None, SPEC])
def test_padded_decode_steps_of_the_cuda_graph_path_give_the_same_outputs(
        make_engine: Callable[..., Engine], spec: SpecConfig | None,
        batch_invariant: bool) -> None:
    """The CUDA-graph path pads a decode step to bucketed shapes (batch, queries, block
    table width) and sends padding rows to a scratch block; run eagerly here, it must give
    what the unpadded step gives."""
    prompts = looping_prompts(5, seed=11)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = make_engine(speculative=spec, max_num_seqs=8)
    expected, _ = run_all(plain, prompts, params)
    padded = make_engine(speculative=spec, max_num_seqs=8)
    r = padded.runner
    r.graphs = DecodeGraphs(r.model, r.caches, r.block_size, 8, 1 + (spec.num_tokens if spec
                            else 0), r.tables.shape[1], padded.blocks.num_blocks * r.block_size,
                            r.group, capture=False)
    got, _ = run_all(padded, prompts, params)
    if batch_invariant:  # padding rows change the rows of the step's products
        assert [s.output_ids for s in got] == [s.output_ids for s in expected]
    assert (padded.acceptance_length > 1.5) == (spec is not None)


def test_step_cost_fits_the_fastest_step_of_each_size() -> None:
    cost = StepCost(min_samples=2)
    assert cost.ratio() is None
    for tokens in (1, 5):
        for slow in (0.0, 40.0, 0.0):  # other load on the machine only adds time
            cost.observe(tokens, 50.0 + 3.0 * tokens + slow)
    assert cost.ratio() == pytest.approx(3.0 / 50.0)


def drafted(proposer: NgramProposer, accept: float, batch: int) -> list[list[int]]:
    """What ``proposer`` keeps of a 4-token draft for each of ``batch`` sequences whose
    drafts have been accepted at rate ``accept`` so far."""
    seqs = [Sequence([1, 2, 3], SamplingParams()) for _ in range(batch)]
    for seq in seqs:
        seq.draft = DraftState(hits=accept, trials=1.0)
    return proposer.select([(seq, [5, 6, 7, 8]) for seq in seqs], batch)


def test_a_step_verifies_the_draft_tokens_that_pay_at_its_batch_size() -> None:
    """At batch 1 on a CPU-like cost (a token 6% of a step) likely drafts are verified
    whole and poor ones cut short; at batch 32 a step is dear, and only drafts almost sure
    to be accepted pay. A fully cut draft pauses its sequence's drafting."""
    proposer = NgramProposer(SpecConfig(num_tokens=4, token_cost=0.06, max_batch_size=32))
    assert [len(d) for d in drafted(proposer, 0.9, 1)] == [4]
    assert 0 < len(drafted(proposer, 0.2, 1)[0]) < 4
    assert all(not d for d in drafted(proposer, 0.2, 32))
    assert all(len(d) == 4 for d in drafted(proposer, 0.99, 32))
    seq = Sequence([1, 2, 3], SamplingParams())
    seq.draft = DraftState(hits=0.01, trials=1.0)
    assert proposer.select([(seq, [5, 6])], 32) == [[]]
    assert seq.draft.paused == proposer.config.pause_steps
    free = NgramProposer(SpecConfig(num_tokens=4, token_cost=0.0))
    assert [len(d) for d in drafted(free, 0.2, 32)] == [4] * 32


def test_speculation_that_does_not_pay_is_cut_and_outputs_stay_the_same(
        make_engine: Callable[..., Engine]) -> None:
    """Random text repeats only by chance: with verification priced (a token 30% of a
    step), fewer draft tokens are verified than when it is free; the same outputs."""
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(2, 96, (60,), generator=g).tolist() for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outs, verified = [], []
    for token_cost in (0.0, 0.3):
        engine = make_engine(speculative=SpecConfig(min_n=1, max_n=2, token_cost=token_cost,
                                                    min_acceptance=0.0, max_batch_size=4))
        seqs = [engine.add(p, params) for p in prompts]
        tokens = 0
        while engine.has_work():
            engine.step()
            tokens += engine.last.draft_tokens
        outs.append([s.output_ids for s in seqs])
        verified.append(tokens)
    assert outs[0] == outs[1]
    assert verified[0] > 20
    assert verified[1] < verified[0] / 2
