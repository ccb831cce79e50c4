"""A fake Amazon Bedrock runtime for tests (raw ASGI, no framework), checking what Bedrock
checks and speaking its wire formats:

- **SigV4**: every request must carry ``Authorization: AWS4-HMAC-SHA256 Credential=...,
  SignedHeaders=..., Signature=...`` and ``x-amz-date``; the signature is recomputed with
  botocore from the request as received (its raw, still percent-encoded path, the signed
  headers, the body) and the fake's own ``secret_key``: a mismatch is Bedrock's 403
  ``InvalidSignatureException``, another access key ``UnrecognizedClientException``, none
  ``MissingAuthenticationTokenException``.
- ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream``: Anthropic's
  Messages body as Bedrock takes it (``anthropic_version`` = ``bedrock-2023-05-31``, no
  ``model`` nor ``stream``, ``anthropic_beta`` a list), checked as the Anthropic fake checks
  a body (:mod:`gateway.testing.anthropic_rules`), answered as it answers; the stream as
  event-stream ``chunk`` frames (:mod:`gateway.testing.eventstream`), the last one with
  ``amazon-bedrock-invocationMetrics``.
- ``POST /model/{modelId}/converse`` and ``/converse-stream``: :mod:`.fake_converse`.
- ``POST /model/{modelId}/count-tokens``: ``{"inputTokens": N}``.
- Errors: the status, ``x-amzn-ErrorType: Name:namespace`` and ``{"message": ...}``.

``simulate_cache=True``: usage from the simulated prompt cache (``cache_control`` blocks;
Converse's ``cachePoint`` blocks read as the breakpoint of the block before them).
Steering headers, as the other fakes (``x-fake-tokens``, ``x-fake-tool``, ``x-fake-ttft-ms``,
``x-fake-fail-times`` with ``x-fake-key``...), and:

=============================  ========================================================
``x-fake-status``               answer this status, the exception named by
                                ``x-fake-error-type`` or the status's usual one
``x-fake-stream-exception``     streaming: this exception frame first (``throttlingException``)
``x-fake-error-midway``         streaming: after N text deltas, ``modelStreamErrorException``
=============================  ========================================================
"""

from __future__ import annotations

import asyncio
import hmac
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.testing import fake_converse
from gateway.testing.anthropic_rules import ApiError, validate_request
from gateway.testing.aws_wire import AwsError, send_body, send_json, start_stream
from gateway.testing.eventstream import chunk_frame, exception_frame
from gateway.testing.fake_anthropic import _answer, _events, count_tokens
from gateway.testing.fake_upstream import FakeUpstream, Record, _wait
from gateway.types import Receive, Scope, Send

__all__ = ["BAD_SIGNATURE", "AwsError", "FakeBedrock"]

_ROUTE = re.compile(r"^/model/([^/]+)/(invoke|invoke-with-response-stream|converse|"
                    r"converse-stream|count-tokens)$")
_BY_STATUS = {400: "ValidationException", 403: "AccessDeniedException",
              404: "ResourceNotFoundException", 408: "ModelTimeoutException",
              424: "ModelErrorException", 429: "ThrottlingException",
              500: "InternalServerException", 503: "ServiceUnavailableException"}
BAD_SIGNATURE = ("The request signature we calculated does not match the signature you "
                 "provided. Check your AWS Secret Access Key and signing method. Consult "
                 "the service documentation for details.")


@dataclass
class FakeBedrock(FakeUpstream):
    """The ASGI app: requests must be signed for ``region`` with ``access_key`` and
    ``secret_key``."""

    access_key: str = "AKIAFAKEBEDROCK00001"
    secret_key: str = "fake-bedrock-secret"
    region: str = "us-east-1"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("raw_path"):
            # the path as sent (percent-encoded): what was signed, and what the model id is in
            scope = {**scope, "path": scope["raw_path"].decode("latin-1")}
        await super().__call__(scope, receive, send)

    async def _dispatch(self, path: str, headers: dict[str, str], data: Any, raw: bytes,
                        rec: Record, disconnected: asyncio.Event, send: Send) -> None:
        try:
            self._check_signature(path, headers, raw)
            found = _ROUTE.match(path) if rec.method == "POST" else None
            if found is None:
                raise AwsError(404, "UnknownOperationException", f"no route {path}")
            model, action = unquote(found.group(1)), found.group(2)
            if not isinstance(data, dict):
                raise AwsError(400, "ValidationException", "The body is not JSON")
            if (ttft := float(headers.get("x-fake-ttft-ms", 0))) and await _wait(
                    disconnected, ttft / 1000):
                return
            self._steered_failure(headers)
            if action.startswith("converse"):
                await fake_converse.serve(model, action == "converse-stream", data, headers,
                                          rec, send, self._sims if self.simulate_cache
                                          else None, self._touch)
                return
            if action == "count-tokens":
                body = orjson.loads(data["input"]["invokeModel"]["body"])
                return await send_json(send, rec, 200, {"inputTokens": count_tokens(body)})
            message = self._invoke(model, data, headers)
        except AwsError as exc:
            return await send_json(send, rec, exc.status, {"message": exc.message},
                                   exc.headers())
        if action == "invoke":
            return await send_json(send, rec, 200, message)
        await self._invoke_stream(message, headers, rec, send)

    def _check_signature(self, path: str, headers: dict[str, str], raw: bytes) -> None:
        """Recompute the request's SigV4 signature (botocore) and compare."""
        auth = headers.get("authorization", "")
        fields: dict[str, str] = {}
        for part in auth.removeprefix("AWS4-HMAC-SHA256 ").split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value
        if not auth.startswith("AWS4-HMAC-SHA256 ") or "x-amz-date" not in headers \
                or not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
            raise AwsError(403, "MissingAuthenticationTokenException",
                           "Missing Authentication Token")
        key, date, region, service, _ = (fields["Credential"].split("/") + [""] * 5)[:5]
        if key != self.access_key:
            raise AwsError(403, "UnrecognizedClientException",
                           "The security token included in the request is invalid.")
        signed = fields["SignedHeaders"].split(";")
        if region != self.region or service != "bedrock" or "host" not in signed \
                or any(name not in headers for name in signed):
            raise AwsError(403, "InvalidSignatureException", BAD_SIGNATURE)
        request = AWSRequest(method="POST", url=f"http://{headers['host']}{path}", data=raw,
                             headers={name: headers[name] for name in signed})
        request.context["timestamp"] = headers["x-amz-date"]
        if not headers["x-amz-date"].startswith(date):
            raise AwsError(403, "InvalidSignatureException", BAD_SIGNATURE)
        signer = SigV4Auth(Credentials(self.access_key, self.secret_key,
                                       headers.get("x-amz-security-token")), "bedrock", region)
        expected = signer.signature(signer.string_to_sign(
            request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, fields["Signature"]):
            raise AwsError(403, "InvalidSignatureException", BAD_SIGNATURE)

    def _steered_failure(self, headers: dict[str, str]) -> None:
        status = int(headers.get("x-fake-status", 0))
        if fail_times := int(headers.get("x-fake-fail-times", 0)):
            self._fail_counts[key := headers.get("x-fake-key", "")] += 1
            status = 0 if self._fail_counts[key] > fail_times else status or 429
        if status:
            name = headers.get("x-fake-error-type") or _BY_STATUS.get(status, "Exception")
            raise AwsError(status, name, "Too many requests, please wait before trying "
                           "again." if status == 429 else f"fake Bedrock error {status}")

    def wire_error(self, rec: Record) -> AwsError | None:
        """What Bedrock would refuse in a recorded request that is the sender's doing
        whatever its client asked (None: nothing): its signature, an InvokeModel body's
        Bedrock keys, a Converse body's shape. An InvokeModel body's Messages content is
        not judged here, nor a Converse body's values (a client's bad request reaches Bedrock
        as it would Anthropic)."""
        try:
            self._check_signature(rec.path, rec.headers, rec.body)
            found = _ROUTE.match(rec.path)
            if found is None or not isinstance(rec.json, dict):
                raise AwsError(400, "ValidationException", f"no JSON body for {rec.path}")
            if found.group(2).startswith("invoke"):
                _bedrock_keys(rec.json)
            elif found.group(2).startswith("converse"):
                fake_converse.as_messages(unquote(found.group(1)), rec.json)
        except fake_converse.ValueRefused:  # the client's own value, as it came
            return None
        except AwsError as exc:
            return exc
        except (KeyError, TypeError, AttributeError) as exc:  # shapes the fake's reader takes
            return AwsError(400, "ValidationException", f"Malformed input request: {exc!r}")
        return None

    def _invoke(self, model: str, data: dict[str, Any], headers: dict[str, str]
                ) -> dict[str, Any]:
        """The Messages answer to an InvokeModel body, checked as Bedrock checks it."""
        _bedrock_keys(data)
        body = {k: v for k, v in data.items() if k not in ("anthropic_version",
                                                           "anthropic_beta")}
        body["model"] = model
        try:
            validate_request(body)
            cache = self.simulate_cache and self._sims.anthropic(body, headers)
            return _answer(body, headers, cache)
        except (ApiError, ValueError) as exc:
            raise AwsError(400, "ValidationException", str(exc)) from exc

    async def _invoke_stream(self, message: dict[str, Any], headers: dict[str, str],
                             rec: Record, send: Send) -> None:
        await start_stream(send, rec)
        if name := headers.get("x-fake-stream-exception"):
            return await send_body(send, exception_frame(name, "Too many requests, please wait "
                                                           "before trying again."), False)
        midway = int(headers.get("x-fake-error-midway", -1))
        events = list(_events(message))
        for i, (event, obj) in enumerate(events):
            text = event == "content_block_delta" and obj["delta"]["type"] == "text_delta"
            if text and rec.chunks_sent == midway:
                return await send_body(send, exception_frame(
                    "modelStreamErrorException", "The model stream failed"), False)
            payload = {"type": event, **obj}
            if event == "message_stop":
                usage = message["usage"]
                payload["amazon-bedrock-invocationMetrics"] = {
                    "inputTokenCount": usage["input_tokens"],
                    "outputTokenCount": usage["output_tokens"],
                    "invocationLatency": 1, "firstByteLatency": 1}
            await send_body(send, chunk_frame(payload), i < len(events) - 1)
            if text:
                rec.chunks_sent += 1
                self._touch()


def _bedrock_keys(data: dict[str, Any]) -> None:
    """An InvokeModel body's own keys as Bedrock checks them (AwsError 400)."""
    if data.get("anthropic_version") != "bedrock-2023-05-31":
        raise AwsError(400, "ValidationException",
                       "Malformed input request: anthropic_version is required")
    for key in ("model", "stream", "metadata"):
        if key in data:
            raise AwsError(400, "ValidationException",
                           f"Malformed input request: extraneous key [{key}] is not "
                           f"permitted, please reformat your input and try again.")
    beta = data.get("anthropic_beta")
    if beta is not None and not (isinstance(beta, list)
                                 and all(isinstance(b, str) for b in beta)):
        raise AwsError(400, "ValidationException", "anthropic_beta: expected a list")
