"""The step loop: schedule, run the model, turn sampled tokens into text, finish sequences.

One :meth:`Engine.step` is one iteration of continuous batching (Orca, OSDI '22): the
scheduler picks decodes and prefill chunks, the model runner computes them in one forward
pass, and each sequence that sampled a token is checked for its end (EOS, a stop string,
``max_tokens``, the context length). Finished and aborted sequences give their KV blocks
back before the next step is scheduled. Not thread-safe: :mod:`local_engine.async_engine`
drives it from one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from local_engine.block_manager import BlockManager
from local_engine.host_memory import keep_freed_memory
from local_engine.model import LlamaModel
from local_engine.model_runner import ModelRunner
from local_engine.scheduler import Scheduler
from local_engine.sequence import SamplingParams, Sequence
from local_engine.speculative import NgramProposer, SpecConfig

__all__ = ["Engine", "EngineConfig", "Output", "PromptTooLong", "detokenize"]


class PromptTooLong(ValueError):
    """The prompt leaves no room for output within the model's context length."""


@dataclass(frozen=True)
class EngineConfig:
    """``kv_cache_mb``: memory for the paged KV cache (MiB), split into blocks of
    ``block_size`` tokens. ``max_batch_tokens``: tokens computed per step (decodes plus
    prefill chunks). ``max_model_len``: prompt plus output, in tokens (capped by the model's
    own limit). ``num_blocks``, when set, overrides ``kv_cache_mb``. ``speculative``: n-gram
    speculative decoding (None: off; see :class:`~local_engine.speculative.SpecConfig`).
    ``cuda_graphs``: replay decode steps as CUDA graphs (on CUDA only; eager otherwise).
    ``kv_cache_dtype``: "auto" (the compute dtype), "int8" or "fp8" (local_engine.kv_cache:
    a scale per token and head; the blocks that ``kv_cache_mb`` holds are counted from the
    bytes a block really takes)."""

    block_size: int = 16
    kv_cache_mb: int = 1024
    num_blocks: int | None = None
    max_num_seqs: int = 32
    max_batch_tokens: int = 512
    max_model_len: int = 2048
    speculative: SpecConfig | None = None
    cuda_graphs: bool = True
    kv_cache_dtype: str = "auto"


@dataclass(slots=True)
class Output:
    """What one step produced for one sequence: new text (stop strings withheld until they
    can be ruled out) and whether the sequence is done (``seq.finish_reason`` says why)."""

    seq: Sequence
    text: str
    finished: bool


@dataclass
class StepStats:
    """Figures of the last step, for metrics: sequences in it, tokens computed, wall ms;
    decoding sequences and the tokens they gained; drafts verified, their tokens, the
    accepted ones, and ``accepted_at[j]``: drafts whose token j was accepted; ``forced``:
    tokens a grammar forced, gained as drafts (not counted among the drafts)."""

    num_seqs: int = 0
    num_tokens: int = 0
    ms: float = 0.0
    decodes: int = 0
    decode_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)
    forced: int = 0  # tokens a grammar forced, verified as drafts (local_engine.grammar)


class Engine:
    """``decode(token_ids) -> str`` turns output tokens into text (a tokenizer's decode)."""

    def __init__(self, model: LlamaModel, decode: Callable[[list[int]], str],
                 config: EngineConfig = EngineConfig(), eos_token_ids: tuple[int, ...] = ()):
        self.model = model
        self.decode = decode
        self.config = config
        self.eos = set(eos_token_ids or ([model.cfg.eos_token_id]
                                         if model.cfg.eos_token_id is not None else []))
        param = next(model.parameters())
        if param.device.type == "cpu":  # steps would map and fault their temporaries anew
            keep_freed_memory()
        per_block = ModelRunner.kv_bytes_per_block(model, config.block_size, param.dtype,
                                                   config.kv_cache_dtype)
        num_blocks = config.num_blocks or max(1, config.kv_cache_mb * 2**20 // per_block)
        self.max_model_len = min(config.max_model_len, model.cfg.max_position_embeddings,
                                 num_blocks * config.block_size)
        self.blocks = BlockManager(num_blocks, config.block_size)
        spec = config.speculative
        self.scheduler = Scheduler(self.blocks, config.max_num_seqs, config.max_batch_tokens,
                                   proposer=NgramProposer(spec) if spec is not None else None,
                                   max_model_len=self.max_model_len,
                                   max_forced=spec.num_tokens if spec else 0)
        self.runner = ModelRunner(model, num_blocks, config.block_size, config.max_num_seqs,
                                  self.max_model_len, spec.num_tokens if spec else 0,
                                  config.cuda_graphs, config.kv_cache_dtype)
        self.last = StepStats()
        self.decodes = 0  # decoding sequence-steps so far (with or without a draft)
        self.decode_tokens = 0  # tokens those gained

    @property
    def acceptance_length(self) -> float:
        """Mean tokens a decoding sequence gains per step, over all steps so far (1.0
        without speculation)."""
        return self.decode_tokens / self.decodes if self.decodes else 1.0

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """Queue a request. Raises ValueError for an empty prompt and PromptTooLong when the
        prompt leaves no room for one output token."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise PromptTooLong(f"the prompt has {len(prompt_ids)} tokens; this model's "
                                f"context length is {self.max_model_len}")
        seq = Sequence(list(prompt_ids), params)
        if params.grammar is not None:
            seq.matcher = params.grammar.matcher()
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` now; its KV blocks are free for the next step."""
        if not seq.finished:
            self.scheduler.abort(seq, "abort")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Output]:
        """Run one iteration; returns an Output for every sequence that sampled a token."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        tokens = self.runner.step(batch)
        now = time.perf_counter()
        stats = StepStats(len(batch), sum(sc.num_new for sc in batch))
        proposer = self.scheduler.proposer
        if proposer is not None and all(sc.decodes for sc in batch):
            # what a decode step costs at this many tokens: speculation's price
            proposer.observe_step(stats.num_tokens, (now - t0) * 1e3)
        outputs: list[Output] = []
        for sc, new in zip(batch, tokens, strict=True):
            seq = sc.seq
            if sc.decodes and seq.first_token_at is not None:
                seq.decode_steps += 1
            else:  # a prompt chunk (or a preempted sequence's recompute)
                seq.prefill_chunks += 1
                seq.prefill_tokens += sc.num_new
            # a decode keeps its last token and the accepted drafts: len(new) - 1 of them
            seq.num_computed = sc.start + (len(new) if sc.decodes else sc.num_new)
            if not new:  # a prefill chunk short of the end
                self.blocks.commit(seq)
                continue
            if sc.decodes:
                stats.decodes += 1
                stats.decode_tokens += len(new)
            if sc.forced:
                stats.forced += len(new) - 1
            elif sc.draft:
                self._count_draft(stats, seq, len(sc.draft), len(new) - 1)
            if seq.first_token_at is None:
                seq.first_token_at = now
            seq.output_ids.extend(new)  # hashed with the blocks they complete, then
            self.blocks.commit(seq)
            del seq.output_ids[-len(new):]  # re-added one at a time, ends checked
            outputs.append(self._append(seq, new))
        stats.ms = (time.perf_counter() - t0) * 1e3
        self.decodes += stats.decodes
        self.decode_tokens += stats.decode_tokens
        self.last = stats
        return outputs

    def _count_draft(self, stats: StepStats, seq: Sequence, proposed: int,
                     accepted: int) -> None:
        assert self.scheduler.proposer is not None  # drafts come only from it
        self.scheduler.proposer.observe(seq, proposed, accepted)
        seq.draft_tokens += proposed
        seq.accepted_tokens += accepted
        stats.drafts += 1
        stats.draft_tokens += proposed
        stats.accepted += accepted
        if len(stats.accepted_at) < proposed:
            stats.accepted_at.extend([0] * (proposed - len(stats.accepted_at)))
        for j in range(accepted):
            stats.accepted_at[j] += 1

    def _append(self, seq: Sequence, new: list[int]) -> Output:
        """Add ``new`` tokens one at a time, each checked as if it came alone, so that an
        accepted run of drafts ends exactly where plain decoding would have (EOS, a stop
        string, ``max_tokens``, the context length); tokens after the end are dropped."""
        text = ""
        for token in new:
            seq.output_ids.append(token)
            if seq.matcher is not None:  # the mask allowed it, so the matcher accepts it
                seq.matcher.consume_token(token)
            out = self._postprocess(seq, token)
            text += out.text
            if out.finished:
                return Output(seq, text, True)
        return Output(seq, text, False)

    def _postprocess(self, seq: Sequence, token: int) -> Output:
        p = seq.params
        reason: str | None = None
        ids = seq.output_ids
        if token in self.eos and not p.ignore_eos:
            reason = "stop"
            ids = ids[:-1]
        at_limit = len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len
        text = seq.text + detokenize(self.decode, seq, ids,
                                     final=reason is not None or at_limit)
        if p.stop:
            # Only the tail can hold a new match: text before ``emitted`` was checked.
            longest = max(len(s) for s in p.stop)
            begin = max(0, seq.emitted - longest)
            hits = [i for i in (text.find(s, begin) for s in p.stop) if i >= 0]
            if hits:
                text = text[:min(hits)]
                reason = "stop"
        if reason is None and at_limit:
            reason = "length"
        seq.text = text
        if reason is not None:
            delta = text[seq.emitted:]
            seq.emitted = len(text)
            self.scheduler.finish(seq, reason)
            return Output(seq, delta, True)
        end = len(text)
        if p.stop:  # hold back what could be the start of a stop string
            end = min(end, len(text) - max(len(s) for s in p.stop) + 1)
        if end > seq.emitted:
            delta = text[seq.emitted:end]
            seq.emitted = end
            return Output(seq, delta, False)
        return Output(seq, "", False)


def detokenize(decode: Callable[[list[int]], str], seq: Sequence, ids: list[int],
               final: bool) -> str:
    """The text that output tokens ``ids`` add since the last call for ``seq``. Decodes a
    window of a few tokens, not the whole output (constant work a step, not linear in the
    output's length): the new text is ``decode(ids[prefix_offset:])`` minus
    ``decode(ids[prefix_offset:read_offset])``, the context keeping spaces and merges right.
    A multi-byte character cut in half (a trailing U+FFFD) waits for its next token unless
    ``final``. As in Hugging Face TGI's ``decode_token`` and vLLM's
    ``detokenize_incrementally``."""
    if len(ids) <= seq.read_offset:
        return ""
    before = decode(ids[seq.prefix_offset:seq.read_offset])
    after = decode(ids[seq.prefix_offset:])
    if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
        return ""
    seq.prefix_offset, seq.read_offset = seq.read_offset, len(ids)
    return after[len(before):]
