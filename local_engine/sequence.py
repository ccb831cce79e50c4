"""Per-request state inside the engine: token ids, status, KV block table, sampling settings."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SamplingParams", "SeqStatus", "Sequence"]


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 means greedy. ``stop`` strings end generation and are not returned.
    ``grammar``: a :class:`local_engine.grammar.Grammar` the output must follow (None: free
    text)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    grammar: Any = None


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request. ``num_computed`` counts tokens whose KV is in the cache (prefix-cache hits
    included). Every step computes some of the tokens ``[num_computed, num_tokens)``; the step
    that reaches ``num_tokens`` samples the next token. A decode step is the case of one
    token left; a prompt (or, after preemption, prompt plus output) is prefilled in chunks."""

    prompt_ids: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=itertools.count().__next__)
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the full blocks so far
    num_computed: int = 0
    num_cached: int = 0  # prompt tokens served from the prefix cache
    skipped: int = 0  # consecutive steps this prefill got no budget
    arrived: float = field(default_factory=time.perf_counter)
    admitted_at: float | None = None  # first admitted to the running batch
    first_token_at: float | None = None
    finish_reason: str | None = None
    text: str = ""  # decoded output so far (stop strings are matched on it)
    # Incremental detokenization: output tokens [prefix_offset, read_offset) are the last
    # ones turned into text, kept as context for the next; [read_offset:) are not text yet.
    prefix_offset: int = 0
    read_offset: int = 0
    emitted: int = 0  # characters of ``text`` already handed to the caller
    generator: Any = None  # torch.Generator when params.seed is set
    # The runner keeps every running sequence's block table as a row (``seat``) of one
    # tensor and copies only the entries added since the last step; the scheduler assigns
    # the seat on admission and resets ``num_synced_blocks`` whenever the table is rebuilt.
    seat: int = -1
    num_synced_blocks: int = 0
    draft: Any = None  # speculative.DraftState once speculation has looked at it
    matcher: Any = None  # llguidance.LLMatcher of params.grammar, advanced token by token
    # What a trace of this request reports (local_engine.tracing), plain ints bumped by the
    # step loop: steps that prefilled it and the tokens they computed (a preempted
    # sequence's recompute included), decode steps, speculative draft tokens verified and
    # accepted, preemptions. ``trace``: a tracing.TraceInfo (None: not traced).
    prefill_chunks: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    preemptions: int = 0
    trace: Any = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def token_ids(self) -> list[int]:
        """A copy of prompt plus output (O(length): not for the per-step path)."""
        return self.prompt_ids + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of prompt plus output, copying only those."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n:end - n]
        return self.prompt_ids[start:] + self.output_ids[:end - n]

    @property
    def in_prefill(self) -> bool:
        return self.num_tokens - self.num_computed > 1

    @property
    def finished(self) -> bool:
        return self.status is SeqStatus.FINISHED
