"""The engine's OpenAI-compatible HTTP server.

    python -m local_engine [--model smollm2] [--port 8081]     (or: gateway engine ...)

Endpoints: POST /v1/chat/completions (stream and non-stream; ``usage`` reports prompt tokens
served from the prefix cache as ``prompt_tokens_details.cached_tokens``; ``response_format``
json_object/json_schema and ``tools``/``tool_choice`` by grammar-constrained decoding, see
:mod:`local_engine.structured`; calls come back as ``tool_calls``, streamed as argument
deltas), POST
/v1/embeddings, POST /v1/completions (scoring only: ``echo: true``, ``max_tokens: 0``,
``logprobs: 0`` returns each prompt token's log-probability; see
:mod:`local_engine.scorer`), GET /v1/models, /metrics, /healthz (with the running and
waiting sequences and KV blocks used), GET /kv_events (the prefix cache's stored and evicted
block hashes, :mod:`local_engine.kv_events`). A client that disconnects aborts its request:
its KV blocks are free at the next step. With ``--tracing``, a chat or completions
request's W3C ``traceparent`` is continued by the engine's spans (:mod:`local_engine.tracing`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from llm_wire.asgi import ClientDisconnected, run_until_disconnect
from local_engine.async_engine import AsyncEngine
from local_engine.calibrate import latency_bounded_batch
from local_engine.chat_stream import collect, stream
from local_engine.engine import Engine, EngineConfig, PromptTooLong
from local_engine.errors import EngineError, InvalidJSON, InvalidRequest
from local_engine.grammar import Grammar, GrammarCompiler, GrammarError
from local_engine.kv_cache import KV_CACHE_DTYPES
from local_engine.loader import DTYPES, load
from local_engine.metrics import EngineMetrics
from local_engine.openai_format import (
    chat_completion,
    embeddings_response,
    encode_chat,
    parse_chat,
    parse_embeddings,
    parse_score,
    score_response,
    usage,
)
from local_engine.quantize import QUANTIZATIONS
from local_engine.scorer import encode_text
from local_engine.speculative import SpecConfig
from local_engine.structured import Structured, compile_structured
from local_engine.tool_calls import CallParser, merge
from local_engine.tracing import make_tracer

__all__ = ["EngineServer", "build_app", "main"]

log = structlog.get_logger("local_engine.server")


@dataclass
class EngineServer:
    """What the app serves: the async engine, the chat model's name and tokenizer, and the
    embedding model's name (None when embeddings are off)."""

    engine: AsyncEngine
    model_name: str
    tokenizer: Any
    embedding_model: str | None
    embed_tokens: Any = None  # texts -> token count, for usage
    default_max_tokens: int = 512
    #: Sequences worth batching at once on this machine (see local_engine.calibrate);
    #: /healthz says it, and the gateway admits that many. None: max_num_seqs.
    capacity: int | None = None
    #: The chat model's compute dtype ("float32", "bfloat16"), for /healthz.
    dtype: str | None = None
    #: ms per prompt token and per output token with the batch full (Calibration.rates),
    #: for /healthz: the gateway predicts service times from them. None: not probed.
    rates: dict[str, float] | None = None
    #: Compiles the grammars of structured outputs and tool calls (None: refused with a 400
    #: that gives ``no_grammars``, why there is none).
    grammars: GrammarCompiler | None = None
    no_grammars: str = "no grammar compiler"

    async def grammar(self, structured: Structured) -> Grammar | None:
        """The compiled grammar of a request's output (None: free text); a grammar not
        compiled before is compiled off the event loop. Raises InvalidRequest."""
        if structured.grammar is None:
            return None
        if self.grammars is None:
            raise InvalidRequest(f"this engine cannot constrain its output ({self.no_grammars})",
                                 param="tools" if structured.calls else "response_format")
        return (self.grammars.cached(structured.grammar)
                or await asyncio.to_thread(compile_structured, self.grammars, structured))

    def encode_chat(self, messages: list[dict[str, str]], continue_final: bool = False
                    ) -> list[int]:
        return encode_chat(self.tokenizer, messages, continue_final)

    def encode_text(self, text: str) -> tuple[list[int], list[int]]:
        """See :func:`local_engine.scorer.encode_text`."""
        return encode_text(self.tokenizer, text)


def _error(exc: EngineError) -> Response:
    return Response(exc.body(), exc.status, media_type="application/json")


async def _json(request: Request) -> Any:
    body = await request.body()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from exc


def build_app(server: EngineServer, metrics: EngineMetrics | None = None) -> Starlette:
    created = int(time.time())

    async def chat(request: Request) -> Response:
        tracer = server.engine.tracer  # its spans are made when the sequence ends
        trace = None if tracer is None else tracer.begin(request.headers, "chat")
        try:
            chat = parse_chat(await _json(request), server.default_max_tokens)
            grammar = await server.grammar(chat.structured)
            prompt = server.encode_chat(chat.messages, chat.continue_final)
            id_ = "chatcmpl-" + uuid.uuid4().hex
            if trace is not None:
                trace.model, trace.response_id = chat.model, id_
            outputs = server.engine.generate(prompt, dataclasses.replace(chat.params,
                                                                         grammar=grammar),
                                             trace)
            first = await anext(outputs)  # errors (prompt too long) surface before headers
        except PromptTooLong as exc:
            return _error(InvalidRequest(str(exc), param="messages",
                                         code="context_length_exceeded"))
        except ValueError as exc:
            return _error(InvalidRequest(str(exc), param="messages"))
        except EngineError as exc:
            return _error(exc)
        if chat.stream:
            return StreamingResponse(stream(chat, id_, len(prompt), first, outputs),
                                     media_type="text/event-stream",
                                     headers={"cache-control": "no-cache",
                                              "x-accel-buffering": "no"})
        try:
            last = await run_until_disconnect(request.receive, collect(first, outputs))
        except ClientDisconnected:
            return Response(status_code=499)
        finally:
            await outputs.aclose()
        seq = last.seq
        text, calls = seq.text, None
        if chat.structured.calls:
            parser = CallParser()
            text, calls = merge(parser.feed(seq.text) + parser.close())
        body = chat_completion(id_, chat.model, int(time.time()), text,
                               seq.finish_reason or "stop",
                               usage(len(prompt), len(seq.output_ids), seq.num_cached), calls)
        return Response(orjson.dumps(body), media_type="application/json")

    async def embeddings(request: Request) -> Response:
        try:
            model, texts, fmt = parse_embeddings(await _json(request))
            if server.embedding_model is None:
                raise InvalidRequest("this engine serves no embedding model", param="model",
                                     code="model_not_found")
            vectors = await server.engine.embed(texts)
        except EngineError as exc:
            return _error(exc)
        tokens = server.embed_tokens(texts) if server.embed_tokens else 0
        return Response(orjson.dumps(embeddings_response(model, vectors, fmt, tokens)),
                        media_type="application/json")

    async def completions(request: Request) -> Response:
        """Legacy completions, for scoring: the prompts' token log-probabilities."""
        tracer = server.engine.tracer
        trace = None if tracer is None else tracer.begin(request.headers, "text_completion")
        failure: Exception | None = None
        try:
            score = parse_score(await _json(request))
            encoded = [server.encode_text(p) for p in score.prompts]
            if any(not ids for ids, _ in encoded):
                raise InvalidRequest("a prompt has no tokens", param="prompt")
            if trace is not None:
                trace.model, trace.input_tokens = score.model, sum(len(i) for i, _ in encoded)
            scored = await run_until_disconnect(
                request.receive, server.engine.score([ids for ids, _ in encoded]))
            body = score_response("cmpl-" + uuid.uuid4().hex, score, int(time.time()),
                                  [(offsets, lp) for (_, offsets), lp in zip(encoded, scored)])
            return Response(orjson.dumps(body), media_type="application/json")
        except ClientDisconnected as exc:
            failure = exc
            return Response(status_code=499)
        except PromptTooLong as exc:
            failure = exc
            return _error(InvalidRequest(str(exc), param="prompt",
                                         code="context_length_exceeded"))
        except EngineError as exc:
            failure = exc
            return _error(exc)
        finally:
            if tracer is not None and trace is not None:
                tracer.request_span(trace, isinstance(failure, ClientDisconnected),
                                    None if isinstance(failure, ClientDisconnected)
                                    else failure)

    async def models(request: Request) -> Response:
        names = [server.model_name] + ([server.embedding_model] if server.embedding_model
                                       else [])
        data = [{"id": n, "object": "model", "created": created, "owned_by": "local_engine"}
                for n in names]
        return Response(orjson.dumps({"object": "list", "data": data}),
                        media_type="application/json")

    async def metrics_endpoint(request: Request) -> Response:
        body = generate_latest(metrics.registry) if metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        core = server.engine.engine
        load = None if core is None else {
            "running": len(core.scheduler.running), "waiting": len(core.scheduler.waiting),
            "kv_blocks": core.blocks.num_blocks, "kv_blocks_used": core.blocks.num_used,
            "block_size": core.config.block_size}
        return Response(orjson.dumps({"status": "ok", "capacity": server.capacity,
                                      "dtype": server.dtype, "rates": server.rates,
                                      "load": load}),
                        media_type="application/json")

    async def kv_events(request: Request) -> Response:
        """The prefix cache's stored/evicted block hashes since ``?since=N`` of
        ``?epoch=E`` (local_engine.kv_events; a snapshot when those are stale)."""
        core = server.engine.engine
        if core is None:
            return Response(b'{"error": "no chat model"}', 404, media_type="application/json")
        try:
            since = int(request.query_params.get("since", "-1"))
        except ValueError:
            since = -1
        blocks = core.blocks
        body = blocks.events.since(request.query_params.get("epoch", ""), since,
                                   lambda: blocks.by_hash)
        body["block_size"] = blocks.block_size
        return Response(orjson.dumps(body), media_type="application/json")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        server.engine.close()

    return Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/kv_events", kv_events, methods=["GET"]),
    ], lifespan=lifespan)


def load_server(model: str, config: EngineConfig, embeddings: bool = True,
                default_max_tokens: int = 512, max_step_slowdown: float = 0.0,
                dtype: str = "auto", quantization: str = "none",
                tracing: bool = False) -> tuple[EngineServer, EngineMetrics]:
    """Load the chat model in ``dtype`` (local_engine.loader.engine_dtype), its weights
    quantized as ``quantization`` says (local_engine.quantize), and the embedder, find the
    latency-bounded batch when ``max_step_slowdown`` > 0 (local_engine.calibrate), and
    start the engine thread, tracing requests when ``tracing`` (local_engine.tracing).
    Raises ValueError for a mode the device cannot run."""
    from transformers.utils import logging as hf_logging

    from local_engine.embedder import EMBEDDING_MODEL, Embedder

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    loaded = load(model, dtype, quantization)
    engine = Engine(loaded.model, lambda ids: loaded.tokenizer.decode(
        ids, skip_special_tokens=True), config, loaded.eos_token_ids)
    calibration = latency_bounded_batch(engine, max_step_slowdown)
    weight = next(loaded.model.parameters())
    compute = str(weight.dtype).removeprefix("torch.")
    log.info("engine_capacity", max_num_seqs=config.max_num_seqs, capacity=calibration.batch,
             decode_step_ms=calibration.step_ms, rates=calibration.rates(),
             device=weight.device.type, dtype=compute, quantization=quantization,
             kv_cache_dtype=config.kv_cache_dtype, kv_blocks=engine.blocks.num_blocks)
    embedder = Embedder.load() if embeddings else None
    metrics = EngineMetrics(engine)
    async_engine = AsyncEngine(engine, embedder, metrics,
                               tracer=make_tracer(tracing, loaded.name)).start()
    server = EngineServer(async_engine, loaded.name, loaded.tokenizer,
                          EMBEDDING_MODEL if embedder else None,
                          embedder.count_tokens if embedder else None, default_max_tokens,
                          calibration.batch, compute, calibration.rates())
    try:
        server.grammars = GrammarCompiler.from_hf(loaded.tokenizer, loaded.eos_token_ids)
    except GrammarError as exc:  # free text still works; constrained output is refused
        server.no_grammars = str(exc)
        log.warning("grammars_unavailable", reason=str(exc))
    return server, metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="'smollm2' (default), a safetensors folder or a GGUF file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--kv-cache-mb", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-batch-tokens", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--default-max-tokens", type=int, default=512)
    parser.add_argument("--no-embeddings", action="store_true")
    parser.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                        help="compute dtype; auto: bfloat16 on CUDA and on CPUs with "
                             "AVX512-BF16 or AMX, else float32")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="none",
                        help="weights quantized at load: int8 (weight-only, a CPU), fp8 "
                             "(CUDA of compute capability 8.9+), none")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="KV cache storage: auto (the compute dtype), int8 or fp8 (a "
                             "scale per token and head; more tokens in --kv-cache-mb)")
    parser.add_argument("--max-step-slowdown", type=float, default=1.3,
                        help="admit (via the gateway) at most the batch whose decode step is "
                             "at most this many times a lone sequence's, measured at start-up "
                             "(local_engine.calibrate); 0: max-num-seqs")
    parser.add_argument("--no-cuda-graphs", action="store_true",
                        help="run decode steps eagerly on CUDA too (graphs are CUDA only)")
    parser.add_argument("--speculative", metavar="JSON", default='{"method": "ngram"}',
                        help='n-gram speculative decoding (default: \'{"method": "ngram"}\'; '
                             'other keys: local_engine.speculative.SpecConfig), or "off"')
    parser.add_argument("--tracing", action="store_true",
                        help="OpenTelemetry spans under the traceparent a request carries, "
                             "sent by OTLP/HTTP to OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT "
                             "(local_engine.tracing)")


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        spec = (None if args.speculative == "off"
                else SpecConfig.from_dict(orjson.loads(args.speculative)))
    except (ValueError, TypeError) as exc:  # bad JSON, keys or values
        raise SystemExit(f"--speculative: {exc}") from exc
    config = EngineConfig(kv_cache_mb=args.kv_cache_mb, max_num_seqs=args.max_num_seqs,
                          max_batch_tokens=args.max_batch_tokens,
                          max_model_len=args.max_model_len, speculative=spec,
                          cuda_graphs=not args.no_cuda_graphs,
                          kv_cache_dtype=args.kv_cache_dtype)
    try:
        server, metrics = load_server(args.model, config, not args.no_embeddings,
                                      args.default_max_tokens, args.max_step_slowdown,
                                      args.dtype, args.quantization, args.tracing)
    except ValueError as exc:  # a quantization this device cannot run, a bad model
        raise SystemExit(f"local_engine: {exc}") from exc
    uvicorn.run(build_app(server, metrics), host=args.host, port=args.port,
                log_level="warning", access_log=False, server_header=False,
                timeout_graceful_shutdown=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return serve(parser.parse_args(argv))
