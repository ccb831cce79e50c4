"""Upstream ``type = "bedrock"``: Amazon Bedrock's runtime API, signed with SigV4
(:mod:`gateway.upstreams.bedrock_auth`), in one of two wire formats (``bedrock.api``):

- ``invoke``: InvokeModel (``POST /model/{modelId}/invoke``) and
  InvokeModelWithResponseStream (``/invoke-with-response-stream``) with Anthropic's
  Messages body, for Claude models. Its API is "anthropic": an Anthropic client's body
  arrives as it came (``cache_control`` breakpoints placed by the prompt_cache stage as for
  Anthropic), an OpenAI or Responses client's translated by the existing bridges, and only
  here does it become Bedrock's: ``model`` moves to the URL, ``stream`` goes (the path
  says it), ``anthropic_version`` is Bedrock's (``bedrock-2023-05-31``), the
  ``anthropic-beta`` header's features (the configured ``beta`` and the client's) become
  the body's ``anthropic_beta`` list, and the first-party-only ``metadata`` and
  ``service_tier`` are left out (Bedrock refuses keys it does not know). The whole answer
  is the Messages API's; the stream's event-stream frames are decoded back into its SSE
  (:mod:`gateway.upstreams.bedrock_stream`). ``/v1/messages/count_tokens`` goes to
  CountTokens (``POST /model/{modelId}/count-tokens``), answered as ``{"input_tokens"}``.
- ``converse``: Converse (``/converse``) and ConverseStream (``/converse-stream``), any
  model; its API is "converse": requests arrive translated (gateway.formats.bridge) with
  the target's ``model`` in the body, which moves to the URL here.

Model ids, inference profile ids (``us.anthropic.claude-sonnet-4-5-20250929-v1:0``) and
ARNs are percent-encoded whole into the path (``:`` and ``/`` included), as Bedrock
requires, and sent without requoting so the signed path is the sent one. Errors become the
Anthropic error shape with the status dispatch classifies by
(:mod:`gateway.upstreams.bedrock_errors`), for either API (the converse bridges read that
shape too). Sources:
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html,
https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html,
https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_CountTokens.html
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import orjson
import structlog
from yarl import URL

from gateway.config import UpstreamConfig
from gateway.errors import InvalidRequest, UpstreamUnreachable
from gateway.upstreams.base import (
    RawHeaders,
    ReadResponse,
    UpstreamRequest,
    UpstreamResponse,
    json_headers,
)
from gateway.upstreams.bedrock_auth import Signer
from gateway.upstreams.bedrock_errors import anthropic_error
from gateway.upstreams.bedrock_stream import (
    EventStreamResponse,
    converse_event,
    invoke_event,
)
from gateway.upstreams.openai import OpenAIUpstream

__all__ = ["BedrockUpstream", "model_path"]

log = structlog.get_logger("gateway.upstreams.bedrock")

#: Messages fields of Anthropic's own API that Bedrock refuses as unknown keys.
_FIRST_PARTY_ONLY = ("model", "stream", "metadata", "service_tier")
#: Client headers that become body fields (or mean nothing) on Bedrock.
_NOT_SENT = ("anthropic-version", "anthropic-beta", "content-type", "accept", "authorization")
_STREAM_TYPE = "application/vnd.amazon.eventstream"


def model_path(model: str, action: str) -> str:
    """``/model/{modelId}/{action}``, the id percent-encoded whole (``:`` and ``/`` too)."""
    return f"/model/{quote(model, safe='')}/{action}"


class BedrockUpstream(OpenAIUpstream):
    provider = "aws.bedrock"

    def __init__(self, name: str, config: UpstreamConfig):
        super().__init__(name, config)
        options = config.bedrock
        self.api = "anthropic" if options.api == "invoke" else "converse"
        self._signer = Signer(options)
        region = self._signer.region
        if not config.base_url and not region:
            log.warning("bedrock_no_region", upstream=name)
        self.base_url = (config.base_url
                         or f"https://bedrock-runtime.{region or 'us-east-1'}.amazonaws.com"
                         ).rstrip("/")
        self._version = options.anthropic_version
        self._beta = tuple(config.beta)

    async def start(self) -> None:
        """Find the credentials once, off the loop (an instance role asks IMDS); without
        any, the upstream is disabled and routing skips it, as an unset key would."""
        if not await asyncio.to_thread(self._signer.resolve):
            self._enabled = False
            log.warning("bedrock_no_credentials", upstream=self.name)

    async def stream(self, request: UpstreamRequest) -> UpstreamResponse:
        credentials = await self._signer.credentials()
        if credentials is None:
            raise UpstreamUnreachable(f"upstream {self.name!r} has no AWS credentials")
        try:
            body = orjson.loads(request.body)
            model = body["model"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise InvalidRequest("the request has no model for Bedrock") from exc
        counting = request.path.endswith("/count_tokens")
        if counting:
            path, out = model_path(model, "count-tokens"), self._count_body(body, request)
        elif self.api == "anthropic":
            action = "invoke-with-response-stream" if request.stream else "invoke"
            path, out = model_path(model, action), self._invoke_body(body, request.headers)
        else:
            action = "converse-stream" if request.stream else "converse"
            path = model_path(model, action)
            out = {k: v for k, v in body.items() if k not in ("model", "stream")}
        payload = orjson.dumps(out)
        url = self.base_url + path
        accept = _STREAM_TYPE if request.stream and not counting else "application/json"
        headers = self._merge(request.headers, request.request_id)
        for name in _NOT_SENT:
            headers.pop(name, None)
        headers.update(self._signer.sign(credentials, url, payload, {
            "content-type": "application/json", "accept": accept}))
        response = await self._open("POST", URL(url, encoded=True), payload, headers)
        if response.status != 200:
            try:
                raw = await response.read()
            finally:
                response.close()
            status, raw = anthropic_error(response.status, response.headers, raw)
            return ReadResponse(status, json_headers(response.headers, raw), raw)
        if counting:
            try:
                answer = await response.read()
            finally:
                response.close()
            return ReadResponse(200, json_headers(response.headers, counted := _counted(answer)), counted)
        if request.stream:
            return EventStreamResponse(response, invoke_event if self.api == "anthropic"
                                       else converse_event)
        return response

    def _invoke_body(self, body: dict[str, Any], client: RawHeaders) -> dict[str, Any]:
        """A Messages body as InvokeModel takes it."""
        out = {k: v for k, v in body.items() if k not in _FIRST_PARTY_ONLY}
        out["anthropic_version"] = self._version
        betas = self._betas(client, body.get("anthropic_beta"))
        if betas:
            out["anthropic_beta"] = betas
        return out

    def _count_body(self, body: dict[str, Any], request: UpstreamRequest) -> dict[str, Any]:
        """A count_tokens body as CountTokens takes it: the InvokeModel body it counts, as a
        string (``max_tokens`` set, which InvokeModel requires and counting ignores)."""
        invoke = self._invoke_body({"max_tokens": 1, **body}, request.headers)
        return {"input": {"invokeModel": {"body": orjson.dumps(invoke).decode()}}}

    def _betas(self, client: RawHeaders, own: Any) -> list[str]:
        """The configured betas, the client's ``anthropic-beta`` headers' (one header or
        several, comma-joined: RFC 9110 5.3) and a body's own list, each once."""
        values = [*self._beta, *(v.decode("latin-1") for k, v in client
                                 if k == b"anthropic-beta")]
        if isinstance(own, list):
            values += [v for v in own if isinstance(v, str)]
        return list(dict.fromkeys(f for f in (p.strip() for v in values for p in v.split(","))
                                  if f))


def _counted(raw: bytes) -> bytes:
    """CountTokens' ``{"inputTokens": N}`` as Anthropic's ``{"input_tokens": N}``."""
    try:
        tokens = orjson.loads(raw).get("inputTokens")
    except (orjson.JSONDecodeError, AttributeError):
        tokens = None
    return orjson.dumps({"input_tokens": tokens if isinstance(tokens, int) else 0})

