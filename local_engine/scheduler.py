"""Iteration-level scheduling with chunked prefill (no torch).

Each step: every running sequence that is decoding gets its next token; new sequences are
admitted while ``max_num_seqs`` and the KV blocks allow; then prompts are prefilled in
chunks from what is left of ``max_batch_tokens``, shortest remaining first. A long prompt
therefore never stalls running decodes, and a short request that arrives behind a long one
gets its first token in its first step (Orca, OSDI '22; Sarathi-Serve, OSDI '24). A prefill
passed over ``starve_steps`` steps in a row jumps the queue, so a stream of short prompts
cannot starve a long one. When blocks run out
during decoding, the newest running sequence is preempted and recomputed later.

With a draft proposer (speculative decoding), a decoding sequence may get draft tokens to
verify in the same step: KV slots are reserved for all of them (or, when blocks are short,
none: the sequence decodes plainly rather than preempting another for a guess), and they
count against ``max_batch_tokens``. The proposer sees all of a step's drafts before any is
scheduled and keeps those worth verifying at this batch size (``Proposer.select``). Drafts
live only in the step's :class:`Scheduled`: a preempted sequence has none.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from local_engine.block_manager import BlockManager, OutOfBlocks
from local_engine.sequence import SeqStatus, Sequence

__all__ = ["Proposer", "Scheduled", "Scheduler"]


class Proposer(Protocol):
    """Draft tokens for speculative decoding (see :mod:`local_engine.speculative`)."""

    def active(self, num_decoding: int) -> bool:
        """Should a step with this many decoding sequences speculate at all?"""
        ...

    def propose(self, seq: Sequence, limit: int) -> list[int]:
        """At most ``limit`` (>= 1) draft tokens to verify after ``seq``'s last token."""
        ...

    def select(self, drafts: list[tuple[Sequence, list[int]]], decoding: int
               ) -> list[list[int]]:
        """The step's drafts (``(seq, draft)`` of those that got one), each cut to what is
        worth verifying in a step with ``decoding`` decoding sequences."""
        ...

    def observe(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """How many of the ``proposed`` draft tokens the model accepted."""
        ...

    def observe_step(self, tokens: int, ms: float) -> None:
        """A decode-only step computed ``tokens`` tokens in ``ms`` (scheduling included)."""
        ...


@dataclass(slots=True)
class Scheduled:
    """One sequence's share of a step: ``num_new`` tokens starting at ``start``; for a
    decode with speculation (or a grammar's forced tokens), its last token and then the
    ``draft`` tokens to verify."""

    seq: Sequence
    start: int
    num_new: int
    draft: list[int] = field(default_factory=list)
    forced: bool = False  # the draft is what the grammar forces, not the proposer's

    @property
    def decodes(self) -> bool:
        """Does this step compute just the sequence's last token (and its draft)?"""
        return self.start == self.seq.num_tokens - 1

    @property
    def samples(self) -> bool:
        """Does this step produce the sequence's next token (prefill done or decoding)?"""
        return self.start + self.num_new >= self.seq.num_tokens


class Scheduler:
    """``max_forced``: the most tokens a grammar forces that a constrained sequence may
    verify as a draft in one step (0: none; at most the runner's draft width)."""

    def __init__(self, blocks: BlockManager, max_num_seqs: int = 32,
                 max_batch_tokens: int = 512, starve_steps: int = 8,
                 proposer: Proposer | None = None, max_model_len: int = 2048,
                 max_forced: int = 0):
        self.blocks = blocks
        self.max_forced = max_forced
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        #: A prefill passed over this many steps in a row goes first (no starvation).
        self.starve_steps = starve_steps
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preempted = 0
        # Seats: rows of the runner's block-table tensor, one per running sequence.
        self.free_seats = list(range(max_num_seqs - 1, -1, -1))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence, reason: str = "abort") -> None:
        """Drop ``seq`` wherever it is; its KV blocks are free for the next step."""
        if seq in self.running:
            self._leave(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = seq.finish_reason or reason

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Scheduled]:
        budget = self.max_batch_tokens
        batch: list[Scheduled] = []
        # 1. decodes, one token each (and their drafts, when speculation pays this step)
        decoding = [seq for seq in self.running if not seq.in_prefill]
        drafts: dict[int, list[int]] = {}
        proposer = self.proposer
        if proposer is not None and proposer.active(len(decoding)):
            found = [(seq, d) for seq in decoding if (d := self._draft(proposer, seq))]
            kept = proposer.select(found, len(decoding))
            drafts = {id(seq): d for (seq, _), d in zip(found, kept, strict=True)}
        for seq in decoding:
            if seq not in self.running:  # preempted for an earlier one's block
                continue
            draft = drafts.get(id(seq), [])
            forced = False
            if not draft and seq.matcher is not None and self.max_forced:
                draft = self._forced(seq)
                forced = bool(draft)
            if draft:
                try:
                    self.blocks.append_slots(seq, 1 + len(draft))
                except OutOfBlocks:
                    draft = []
            while not draft:
                try:
                    self.blocks.append_slots(seq, 1)
                    break
                except OutOfBlocks:
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is seq:
                        break
            if seq in self.running:
                batch.append(Scheduled(seq, seq.num_tokens - 1, 1 + len(draft), draft,
                                       forced and bool(draft)))
                budget -= 1 + len(draft)
        # 2. admit new sequences while seats, blocks and some compute are left
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            try:
                self.blocks.allocate(seq)
            except OutOfBlocks:
                break
            self.waiting.popleft()
            seq.seat = self.free_seats.pop()
            seq.num_synced_blocks = 0
            seq.status = SeqStatus.RUNNING
            if seq.admitted_at is None:
                seq.admitted_at = time.perf_counter()
            self.running.append(seq)
        # 3. prefill chunks, shortest remaining first: a short prompt is not held behind a
        # long one, and a long one advances by whatever budget is left each step
        scheduled = {id(sc.seq) for sc in batch}
        prefills = sorted((s for s in self.running if id(s) not in scheduled),
                          key=lambda s: (s.skipped < self.starve_steps,
                                         s.num_tokens - s.num_computed))
        for seq in prefills:
            if budget <= 0:
                seq.skipped += 1
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            batch.append(Scheduled(seq, seq.num_computed, n))
            budget -= n
            seq.skipped = 0
        return batch

    def _room(self, seq: Sequence) -> int:
        """Draft tokens that fit: room for them and one more token within ``max_tokens``
        and the context length."""
        return min(seq.params.max_tokens - len(seq.output_ids),
                   self.max_model_len - seq.num_tokens) - 1

    def _draft(self, proposer: Proposer, seq: Sequence) -> list[int]:
        limit = self._room(seq)
        return proposer.propose(seq, limit)[:limit] if limit > 0 else []

    def _forced(self, seq: Sequence) -> list[int]:
        """The tokens the sequence's grammar forces next (the fixed text of a call's head,
        a property name), as a draft: verified like any other, always accepted, so a run of
        them costs one step (jump-forward decoding, as SGLang's compressed FSM does)."""
        limit = min(self._room(seq), self.max_forced)
        return list(seq.matcher.compute_ff_tokens())[:limit] if limit > 0 else []

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: prompt and output so far are prefilled again when it is readmitted
        (cheaply, where their blocks are still in the prefix cache)."""
        self._leave(seq)
        self.blocks.release(seq)
        seq.num_computed = 0
        self.num_preempted += 1
        seq.preemptions += 1
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def _leave(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.free_seats.append(seq.seat)
        seq.seat = -1

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.abort(seq, reason)
