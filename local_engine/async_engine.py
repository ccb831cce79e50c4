"""The engine's async face: every piece of torch work runs on one dedicated thread.

Callers on any event loop ``await``/``async for`` results; the worker thread takes new
requests, aborts, embedding batches and scoring jobs between steps, so a cancelled request
frees its KV blocks before the next step is scheduled, and embeddings of concurrent requests
are computed as one batch (micro-batching) without waiting on a timer. A scoring job
(:mod:`local_engine.scorer`) runs one chunk of at most ``max_batch_tokens`` tokens between
two steps, so decodes running beside it wait at most one prefill chunk per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from local_engine.engine import Engine, Output, PromptTooLong
from local_engine.metrics import EngineMetrics
from local_engine.scorer import ScoreBatch
from local_engine.sequence import SamplingParams, Sequence

if TYPE_CHECKING:
    from local_engine.tracing import EngineTracer, TraceInfo

__all__ = ["AsyncEngine", "EngineClosed"]


class EngineClosed(RuntimeError):
    """The engine was shut down."""


@dataclass(eq=False)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    results: asyncio.Queue[Output | BaseException] = field(default_factory=asyncio.Queue)
    seq: Sequence | None = None
    done: bool = False
    trace: TraceInfo | None = None


@dataclass(eq=False)
class _ScoreJob:
    seqs: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[np.ndarray]]
    batch: ScoreBatch | None = None


@dataclass(eq=False)
class _EmbedJob:
    texts: list[str]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[np.ndarray]


class AsyncEngine:
    """``engine`` generates and scores; ``embed_fn(texts) -> [n, dim] float32`` embeds
    (either may be None). ``max_embed_batch``: texts per embedding forward pass;
    ``max_score_tokens``: tokens one scoring call may hold (its scratch KV cache).
    ``tracer``: traces requests that carry a TraceInfo (:mod:`local_engine.tracing`; None:
    off), shut down by :meth:`close`."""

    def __init__(self, engine: Engine | None,
                 embed_fn: Callable[[list[str]], np.ndarray] | None = None,
                 metrics: EngineMetrics | None = None, max_embed_batch: int = 64,
                 max_score_tokens: int = 8192, tracer: EngineTracer | None = None):
        self.engine = engine
        self.embed_fn = embed_fn
        self.metrics = metrics
        self.tracer = tracer
        self.max_embed_batch = max_embed_batch
        self.max_score_tokens = max_score_tokens
        self._scores: list[_ScoreJob] = []
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._closed = False
        self._active: dict[int, _Request] = {}  # seq_id -> request
        self._embeds: list[_EmbedJob] = []
        self._thread = threading.Thread(target=self._run, name="local-engine", daemon=True)

    def start(self) -> AsyncEngine:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the worker thread; open requests end with EngineClosed; then export the
        spans still queued (blocks up to the exporter's timeout when tracing)."""
        self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.tracer is not None:
            self.tracer.shutdown()

    def _submit(self, kind: str, item: Any) -> None:
        if self._closed:
            raise EngineClosed("the engine is shut down")
        self._inbox.put((kind, item))
        self._wake.set()

    # -- caller side (any event loop) ------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       trace: TraceInfo | None = None) -> AsyncGenerator[Output, None]:
        """Outputs as steps produce them; the last has ``finished`` set. Leaving the loop
        early (or being cancelled) aborts the request. Raises what :meth:`Engine.add` raises
        (ValueError, PromptTooLong) and EngineClosed. ``trace``: the request's trace
        context (with a tracer, its spans are made when it ends)."""
        if self.engine is None:
            raise EngineClosed("this engine serves no generation model")
        request = _Request(prompt_ids, params, asyncio.get_running_loop(), trace=trace)
        self._submit("add", request)
        try:
            while True:
                out = await request.results.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finished:
                    request.done = True
                    return
        finally:
            if not request.done and not self._closed:
                self._submit("abort", request)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings [len(texts), dim] float32, batched with other callers' texts."""
        if self.embed_fn is None:
            raise EngineClosed("this engine serves no embedding model")
        loop = asyncio.get_running_loop()
        job = _EmbedJob(texts, loop, loop.create_future())
        self._submit("embed", job)
        return await job.future

    async def score(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """``log p(t_i | t_<i)`` of every token of each text (``seqs``: token ids), as
        float32 arrays of the texts' lengths, NaN at index 0
        (:class:`~local_engine.scorer.ScoreBatch`). Raises ValueError for an empty text,
        PromptTooLong past ``max_score_tokens`` in all or the model's context length in one
        text, EngineClosed without a model."""
        if self.engine is None:
            raise EngineClosed("this engine serves no generation model")
        if not seqs or any(not ids for ids in seqs):
            raise ValueError("every text to score needs at least one token")
        total, longest = sum(map(len, seqs)), max(map(len, seqs))
        limit = self.engine.model.cfg.max_position_embeddings
        if total > self.max_score_tokens or longest > limit:
            raise PromptTooLong(f"the texts to score have {total} tokens (the longest "
                                f"{longest}); this engine scores at most "
                                f"{self.max_score_tokens} a call, {limit} a text")
        loop = asyncio.get_running_loop()
        job = _ScoreJob(seqs, loop, loop.create_future())
        self._submit("score", job)
        return await job.future

    # -- worker thread ---------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while not self._closed:
            self._drain()
            embedded = self._embed_pending()
            scored = self._score_chunk()
            if engine is not None and engine.has_work():
                try:
                    outputs = engine.step()
                except Exception as exc:  # noqa: BLE001 - a model failure ends the batch, not the server
                    self._fail_all(exc)
                    continue
                self._deliver(outputs)
                if self.metrics is not None:
                    self.metrics.observe_step(engine)
            elif not embedded and not scored:
                self._wake.wait()
                self._wake.clear()
        self._fail_all(EngineClosed("the engine is shut down"))
        for job in self._scores:
            with contextlib.suppress(RuntimeError):
                job.loop.call_soon_threadsafe(_settle, job.future,
                                              EngineClosed("the engine is shut down"))

    def _drain(self) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._add(item)
            elif kind == "abort":
                if item.seq is not None and not item.seq.finished:
                    assert self.engine is not None
                    self.engine.abort(item.seq)
                    self._active.pop(item.seq.seq_id, None)
                    if self.metrics is not None:
                        self.metrics.aborted.inc()
                    if item.seq.trace is not None:
                        self._traced(item.seq, cancelled=True)
            elif kind == "score":
                self._scores.append(item)
            else:
                self._embeds.append(item)

    def _add(self, request: _Request) -> None:
        assert self.engine is not None
        try:
            request.seq = self.engine.add(request.prompt_ids, request.params)
        except ValueError as exc:
            if request.trace is not None and self.tracer is not None:
                request.trace.input_tokens = len(request.prompt_ids)
                self.tracer.request_span(request.trace, error=exc)
            request.loop.call_soon_threadsafe(request.results.put_nowait, exc)
            return
        request.seq.trace = request.trace
        self._active[request.seq.seq_id] = request

    def _deliver(self, outputs: list[Output]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Request, Output]]] = {}
        traced: list[Sequence] = []
        for out in outputs:
            request = self._active.get(out.seq.seq_id)
            if request is None:
                continue
            if out.finished:
                del self._active[out.seq.seq_id]
                if self.metrics is not None:
                    self.metrics.observe_finished(out.seq, time.perf_counter())
                if out.seq.trace is not None:
                    traced.append(out.seq)
            by_loop.setdefault(request.loop, []).append((request, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the caller's loop is closed: nobody is listening
                for request, _ in items:
                    seq = request.seq
                    if seq is not None and self.engine is not None and not seq.finished:
                        self.engine.abort(seq)
                        if seq.trace is not None:
                            self._traced(seq, cancelled=True)
        for seq in traced:  # after the delivery: the callers need not wait for spans
            self._traced(seq)

    def _traced(self, seq: Sequence, cancelled: bool = False,
                error: BaseException | None = None) -> None:
        """Make ``seq``'s spans now that it has ended (it carries a TraceInfo)."""
        if self.tracer is not None:
            self.tracer.sequence_span(seq, time.perf_counter(), cancelled, error)

    def _fail_all(self, exc: BaseException) -> None:
        for request in list(self._active.values()):
            if request.seq is not None and self.engine is not None:
                self.engine.abort(request.seq)
                if request.seq.trace is not None:
                    self._traced(request.seq, error=exc)
            try:
                request.loop.call_soon_threadsafe(request.results.put_nowait, exc)
            except RuntimeError:
                pass
        self._active.clear()

    def _score_chunk(self) -> bool:
        """One chunk of the oldest scoring job (its caller still waiting); False when there
        was none."""
        while self._scores and self._scores[0].future.done():  # its caller gave up
            self._scores.pop(0)
        if not self._scores:
            return False
        job = self._scores[0]
        result: Any
        try:
            if job.batch is None:
                assert self.engine is not None
                job.batch = ScoreBatch(self.engine.model, job.seqs,
                                       self.engine.config.max_batch_tokens,
                                       self.engine.config.block_size,
                                       self.engine.config.kv_cache_dtype)
            if not job.batch.advance():
                return True
            result = job.batch.logprobs
        except Exception as exc:  # noqa: BLE001 - delivered to the caller
            result = exc
        self._scores.pop(0)
        try:
            job.loop.call_soon_threadsafe(_settle, job.future, result)
        except RuntimeError:
            pass
        return True

    def _embed_pending(self) -> bool:
        if not self._embeds:
            return False
        # A caller that has gone (a shed request's cache lookup, a client that left) is not
        # embedded for: under overload that work would only take the CPU from the rest. One
        # forward pass a call (whole jobs, up to max_embed_batch texts unless one job holds
        # more), so that callers gone while it ran are skipped by the next.
        pending = [job for job in self._embeds if not job.future.cancelled()]
        if not pending:
            self._embeds = []
            return True
        take, size = 0, 0
        while take < len(pending) and (take == 0 or size + len(pending[take].texts)
                                       <= self.max_embed_batch):
            size += len(pending[take].texts)
            take += 1
        jobs, self._embeds = pending[:take], pending[take:]
        texts = [t for job in jobs for t in job.texts]
        try:
            assert self.embed_fn is not None
            parts = [self.embed_fn(texts[i:i + self.max_embed_batch])
                     for i in range(0, len(texts), self.max_embed_batch)]
            vectors: np.ndarray | None = np.concatenate(parts)
            error: BaseException | None = None
        except Exception as exc:  # noqa: BLE001 - delivered to the callers
            vectors, error = None, exc
        if self.metrics is not None:
            self.metrics.embed_batch.observe(len(texts))
        offset = 0
        for job in jobs:
            n = len(job.texts)
            result = error if vectors is None else vectors[offset:offset + n]
            offset += n
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result)
            except RuntimeError:
                pass
        return True


def _put_all(items: list[tuple[_Request, Output]]) -> None:
    for request, out in items:
        request.results.put_nowait(out)


def _settle(future: asyncio.Future[Any], result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
