"""Lossless n-gram speculative decoding: draft tokens looked up in the sequence itself, all
verified by the model in one forward pass, kept only where the model agrees.

Proposer: prompt-lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding;
vLLM's ``ngram`` method): the sequence's last ``n`` tokens (``max_n`` down to ``min_n``) are
looked up among its earlier tokens (prompt and output) and the ``k`` tokens that followed
their latest earlier occurrence become the draft (when that occurrence is within ``k`` tokens
of the end, the sequence is looping and the draft goes round the loop). The lookup is a dict per sequence from
n-gram to where its continuation starts, updated by the few tokens each step adds, so a
proposal costs a handful of dict operations however long the sequence is. No draft model:
it pays where the output repeats its input (quote, extract, edit given code, summarise).

Verification: the step computes the sequence's last token and its ``k`` drafts as ``k + 1``
queries (one forward for the whole batch), giving the target distribution ``p_j`` at each.
Greedy requests keep drafts while they equal the argmax, then take the argmax. Sampled
requests use speculative sampling's rejection rule (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding", ICML 2023; Chen et al., "Accelerating Large Language
Model Decoding with Speculative Sampling", 2023) with a one-hot draft ``q = δ_x``: accept
``x`` with probability ``min(1, p(x) / q(x)) = p(x)``; on rejection sample from
``max(0, p - q)`` normalised, i.e. ``p`` with ``x`` removed. Every emitted token is then
distributed exactly as plain sampling from ``p``; after ``k`` acceptances a bonus token is
sampled from ``p_k``. Outputs are those of plain decoding (greedy: identical up to
floating-point ties).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from local_engine.sampling import draw, sampling_tensors, target_probs, uniform
from local_engine.sequence import SamplingParams, Sequence

__all__ = ["DraftState", "NgramProposer", "SpecConfig", "StepCost", "verify"]


@dataclass(frozen=True)
class SpecConfig:
    """``num_tokens``: the most draft tokens a sequence verifies in a step (k; each
    sequence's draft length adapts below it). ``min_n``/``max_n``: suffix lengths looked
    up, longest first. Speculation is skipped for the whole step (no lookup, no extra
    tokens) when more than ``max_batch_size`` sequences decode in it or their tokens with
    drafts could exceed ``max_step_tokens``: a large batch already uses the hardware well,
    and verifying rejected drafts would slow it down (vLLM's ngram method lost 1.8x at high
    load without such a cut). A sequence whose recent share of accepted draft tokens falls
    below ``min_acceptance`` stops drafting for ``pause_steps`` steps (its rate is an
    exponential moving average with weight ``ewma`` on the newest draft).

    Within those bounds every step keeps only the draft tokens that pay (``goodput``): a
    draft token's expected gain is its sequence's acceptance probability to the power of its
    position, its cost the step time one more token adds, measured on this machine while
    serving (:class:`StepCost`); the step verifies the drafts that maximise expected tokens
    per second (SmartSpec: Liu et al., "Optimizing Speculative Decoding for Serving Large
    Language Models Using Goodput", 2024). ``token_cost`` fixes a token's cost as a share of
    a step's fixed cost instead of measuring it (0: every draft pays, as without the rule).

    The defaults suit a CPU, where verifying extra tokens costs real compute: on a GPU a
    decode step is launch- or memory-bound and ``max_batch_size`` can be much larger (an
    H200 gained 1.5x at batch 8 on repetitive text). ``min_n`` 3 keeps chance matches of
    common word pairs in open chat from costing verifications."""

    method: str = "ngram"
    num_tokens: int = 8
    min_n: int = 3
    max_n: int = 4
    max_batch_size: int = 4
    max_step_tokens: int = 64
    min_acceptance: float = 0.25
    pause_steps: int = 16
    ewma: float = 0.3
    goodput: bool = True
    token_cost: float | None = None

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative method {self.method!r} is not supported; "
                             "the engine runs 'ngram'")
        if not 1 <= self.num_tokens <= 16:
            raise ValueError("speculative num_tokens must be between 1 and 16")
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError("speculative needs 1 <= min_n <= max_n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecConfig:
        """Raises ValueError naming an unknown key and the allowed ones."""
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ValueError(f"unknown speculative key {unknown[0]!r}; allowed: "
                             + ", ".join(sorted(allowed)))
        return cls(**data)


@dataclass(eq=False)
class DraftState:
    """Per sequence: ``index`` maps an n-gram (a tuple of n tokens) to the position right
    after its latest occurrence, for occurrences ending at positions ``< indexed``."""

    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0
    rate: float = 1.0  # recent accepted / proposed draft tokens
    paused: int = 0  # steps left without drafting
    k: int = 0  # draft length now (0: not set yet)
    # per-token acceptance probability, as recent accepted tokens over recent trials (a
    # draft token accepted, or the one rejection that ends a draft); trials 0: not drafted yet
    hits: float = 0.0
    trials: float = 0.0


class StepCost:
    """What a decode step costs on this machine, ``ms = fixed + per_token * tokens``,
    measured while serving: for each token count, the fastest of its last ``window`` steps
    (whatever else runs on the machine only adds time; the minimum is the step's own cost,
    as :mod:`local_engine.calibrate` takes it), and a least-squares line through the counts
    seen at least ``min_samples`` times. With fewer than two such counts a token costs
    ``prior`` of the fixed cost (a 135M model's decode step on a 2-core CPU: about 3 ms a
    token over 50 ms)."""

    def __init__(self, window: int = 32, min_samples: int = 4, prior: float = 0.06):
        self.window = window
        self.min_samples = min_samples
        self.prior = prior
        self.samples: dict[int, deque[float]] = {}
        self._fit: tuple[float, float] | None = None

    def observe(self, tokens: int, ms: float) -> None:
        """A decode-only step that computed ``tokens`` tokens in ``ms``."""
        q = self.samples.get(tokens)
        if q is None:
            q = self.samples[tokens] = deque(maxlen=self.window)
        q.append(ms)
        self._fit = None

    def ratio(self) -> float | None:
        """A token's cost over a step's fixed cost (None: no step seen yet)."""
        if self._fit is None:
            points = [(t, min(q)) for t, q in self.samples.items()
                      if len(q) >= self.min_samples]
            if not points:
                return None
            if len(points) == 1:
                t, ms = points[0]
                fixed = ms / (1 + self.prior * t)
                self._fit = (fixed, self.prior * fixed)
            else:
                n = len(points)
                mx = sum(t for t, _ in points) / n
                my = sum(ms for _, ms in points) / n
                var = sum((t - mx) ** 2 for t, _ in points)
                slope = max(0.0, sum((t - mx) * (ms - my) for t, ms in points) / var)
                self._fit = (max(my - slope * mx, 1e-6), slope)
        fixed, per_token = self._fit
        return per_token / fixed


class NgramProposer:
    """Drafts for the scheduler and the per-sequence acceptance bookkeeping (no torch work;
    a :class:`~local_engine.scheduler.Proposer`). ``alpha`` is the acceptance probability
    of a draft token over all sequences lately, a new sequence's estimate."""

    def __init__(self, config: SpecConfig):
        self.config = config
        self.cost = StepCost()
        self.alpha = 0.5

    def active(self, num_decoding: int) -> bool:
        """Is speculation worth its work in a step with this many decoding sequences?"""
        c = self.config
        return (num_decoding <= c.max_batch_size
                and num_decoding * (1 + c.num_tokens) <= c.max_step_tokens)

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """Up to ``min(num_tokens, limit)`` draft tokens for ``seq`` (often none)."""
        state: DraftState | None = seq.draft
        if state is None:
            state = seq.draft = DraftState()
        if state.paused:
            state.paused -= 1
            return []
        length = seq.num_tokens
        k = min(state.k or self.config.num_tokens, limit)
        self._index(seq, state, length)
        for n in range(min(self.config.max_n, length - 1), self.config.min_n - 1, -1):
            at = state.index.get(tuple(seq.tokens(length - n, length)))
            if at is not None:
                draft = seq.tokens(at, min(at + k, length))
                # A match close to the end is a loop of period length - at: the draft
                # continues round it (the text is repeating itself)
                for i in range(len(draft), k):
                    draft.append(draft[i - (length - at)])
                return draft
        return []

    def _index(self, seq: Sequence, state: DraftState, length: int) -> None:
        """Index the n-grams ending at ``[indexed, length - 1]``: each has a continuation,
        and the sequence's own suffix (ending at ``length``) is not among them."""
        lo, hi = self.config.min_n, self.config.max_n
        start = max(state.indexed, lo)
        if start <= length - 1:
            first = max(0, start - hi)
            tokens = seq.tokens(first, length - 1)  # only the tail new n-grams touch
            index = state.index
            for end in range(start, length):
                for n in range(lo, min(hi, end) + 1):
                    index[tuple(tokens[end - n - first:end - first])] = end
        state.indexed = length

    def observe_step(self, tokens: int, ms: float) -> None:
        """A decode-only step's cost (:class:`StepCost`)."""
        self.cost.observe(tokens, ms)

    def acceptance(self, seq: Sequence) -> float:
        """The estimated probability that ``seq``'s next draft token is accepted."""
        state: DraftState | None = seq.draft
        if state is None or state.trials <= 0:
            return self.alpha
        return state.hits / state.trials

    def select(self, drafts: list[tuple[Sequence, list[int]]], decoding: int
               ) -> list[list[int]]:
        """The drafts worth verifying in a step with ``decoding`` decoding sequences: each
        cut to the length that maximises the step's expected tokens per unit of time. Draft
        token j (from 1) of a sequence with acceptance ``a`` adds ``a ** j`` expected tokens
        and one token of work; tokens are kept best first while the ratio grows. A sequence
        whose whole draft is cut pauses drafting (``pause_steps``), its estimate moved
        halfway back to the overall one, so that it tries again later."""
        c = self.config
        if not c.goodput or not drafts:
            return [d for _, d in drafts]
        ratio = c.token_cost if c.token_cost is not None else self.cost.ratio()
        if ratio is None:
            ratio = self.cost.prior
        gains = sorted(((self.acceptance(seq) ** (j + 1), i)
                        for i, (seq, d) in enumerate(drafts) for j in range(len(d))),
                       reverse=True)
        # time in units of a step's fixed cost: 1 + ratio * tokens
        tokens, value = decoding, float(decoding)
        best, best_n = value / (1 + ratio * tokens), 0
        for n, (gain, _) in enumerate(gains, 1):
            tokens += 1
            value += gain
            rate = value / (1 + ratio * tokens)
            if rate > best * (1 + 1e-9):
                best, best_n = rate, n
        keep = [0] * len(drafts)
        for _, i in gains[:best_n]:
            keep[i] += 1
        out = []
        for (seq, d), n in zip(drafts, keep, strict=True):
            if not n:  # every draft here has a token; this one lost all of them
                state: DraftState = seq.draft
                state.paused = c.pause_steps
                if state.trials > 0:
                    state.hits = state.trials * (self.acceptance(seq) + self.alpha) / 2
            out.append(d[:n])
        return out

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """Record a verified draft: the next draft is 2 tokens longer after a fully
        accepted one (up to ``num_tokens``), 1 shorter otherwise (Hugging Face assisted
        generation's "heuristic" schedule); drafting pauses when the rate falls too low.
        The acceptance estimates count the accepted tokens and the rejection, if any, that
        ended the draft (a geometric run's trials)."""
        state: DraftState = seq.draft
        c = self.config
        k = state.k or c.num_tokens
        state.k = min(c.num_tokens, k + 2) if accepted == proposed else max(1, k - 1)
        state.rate = (1 - c.ewma) * state.rate + c.ewma * accepted / proposed
        trials = accepted + (accepted < proposed)
        if state.trials <= 0:  # the first draft: start from the overall estimate
            state.hits, state.trials = self.alpha, 1.0
        state.hits = (1 - c.ewma) * state.hits + c.ewma * accepted
        state.trials = (1 - c.ewma) * state.trials + c.ewma * trials
        w = c.ewma / 4  # the overall estimate moves more slowly
        self.alpha = (1 - w) * self.alpha + w * accepted / trials
        if state.rate < c.min_acceptance:
            state.paused = c.pause_steps
            state.rate = c.min_acceptance  # one good draft after the pause resumes it


def verify(logits: torch.Tensor, spans: list[tuple[int, int]], drafts: list[list[int]],
           params: list[SamplingParams], generators: list[torch.Generator | None]
           ) -> list[list[int]]:
    """Accept or reject drafts; returns each sequence's new tokens (the accepted drafts,
    then one token sampled or taken greedily: a correction or the bonus).

    ``logits`` [R, V] float32; sequence b's ``1 + len(drafts[b])`` rows start at
    ``spans[b][0]``: row j predicts the token after draft token j - 1. All sequences are
    handled at once on [B, Q, V] tensors (Q = 1 + the longest draft)."""
    dev = logits.device
    b = len(drafts)
    counts = [len(d) for d in drafts]
    q = 1 + max(counts)
    rows = torch.tensor([[first + min(j, n) for j in range(q)]
                         for (first, _), n in zip(spans, counts, strict=True)], device=dev)
    pad = torch.tensor([d + [0] * (q - 1 - len(d)) for d in drafts], device=dev).view(b, q - 1)
    n = torch.tensor(counts, device=dev)
    real = torch.arange(q - 1, device=dev)[None, :] < n[:, None]  # [B, Q-1]
    table = logits.index_select(0, rows.flatten()).view(b, q, -1)
    greedy = table.argmax(-1)  # [B, Q]
    accepted = ((greedy[:, :-1] == pad) & real).int().cumprod(1).sum(1)
    final = greedy.gather(1, accepted[:, None])[:, 0]
    if any(p.temperature > 0 for p in params):
        temperature, top_p = sampling_tensors(params, dev)
        probs = target_probs(table.view(b * q, -1), temperature.clamp_min(1e-5)
                             .repeat_interleave(q),
                             None if top_p is None else top_p.repeat_interleave(q)
                             ).view(b, q, -1)
        p_draft = probs[:, :-1].gather(-1, pad[..., None])[..., 0]  # [B, Q-1]
        u = uniform((b, q - 1), generators, dev)
        kept = ((u < p_draft) & real).int().cumprod(1).sum(1)
        # rejected token j's residual is p_j without the draft; row n_b stays p_{n_b}
        residual = probs.clone()
        drop = torch.zeros_like(probs[:, :-1]).scatter_(-1, pad[..., None], 1.0).bool()
        residual[:, :-1].masked_fill_(drop & real[..., None], 0.0)
        # only the row where each sequence stopped is drawn from: one draw per sequence
        chosen = draw(residual[torch.arange(b, device=dev), kept], generators)
        sampled = temperature > 0
        accepted = torch.where(sampled, kept, accepted)
        final = torch.where(sampled, chosen, final)
    out: list[list[int]] = []
    for draft, a, last in zip(drafts, accepted.tolist(), final.tolist(), strict=True):
        out.append(draft[:a] + [last])
    return out
