"""One dispatch's exchange with its targets, both ways: what each target is sent, and what
an upstream's whole answer says. (The trying itself is :mod:`gateway.dispatch`.)

:class:`Outbound` makes the request for a target on its first attempt and keeps it for the
retries: the client's bytes as they came when nothing changes them (``model`` rewritten
when it differs, the usage option spliced in), else the body translated for an upstream of
the other API (:mod:`gateway.formats.bridge`; a Responses request's hosted tools left out
first when the policy drops them, said in the answer's ``x-gateway-dropped-tools`` header
and the log line) and shaped by ``ctx.shape_body``, serialised once; to the upstream that keeps a Responses conversation (``ctx.upstream_state``), the
client's own request, ``previous_response_id`` and all. :func:`observe` reads a whole answer, parsed once by dispatch: its error into the log
line, its usage and finish reason into the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from gateway import jsonio
from gateway.config import Target
from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.formats.anthropic import finish_reason_of
from gateway.formats.bridge import Bridge, bridge
from gateway.formats.gemini import usage_of as gemini_usage
from gateway.formats.openai import with_usage_option
from gateway.formats.responses import response_finish_reason
from gateway.formats.responses_tools import without_hosted_tools
from gateway.formats.translator import Translator
from gateway.formats.usage import Usage
from gateway.http import forward_request_headers
from gateway.upstreams.base import Upstream, UpstreamRequest

__all__ = ["Outbound", "observe"]


class Outbound:
    """What one dispatch sends each target: made on a target's first attempt (translated
    for an upstream of the other API, shaped by ``ctx.shape_body``, serialised) and kept for
    its retries. ``hide_usage``: the client gets no usage chunk it did not ask for."""

    __slots__ = ("_api", "_built", "_crossing", "_dropped_said", "_inject", "_max_tokens",
                 "_target", "_upstreams", "body", "ctx", "forwarded", "hide_usage", "raw")

    def __init__(self, ctx: RequestContext, upstreams: dict[str, Upstream]) -> None:
        self.ctx = ctx
        self._upstreams = upstreams
        self._api = ctx.api.name
        self._dropped_said = False
        body, raw = ctx.body, ctx.raw
        # An OpenAI stream's usage chunk: asked of OpenAI-style upstreams (observe_usage) and
        # always made by the Anthropic translation; forwarded only to clients that asked.
        self.hide_usage = self._inject = False
        if ctx.stream and self._api == "openai":
            options = body.get("stream_options") or {}
            if not options.get("include_usage"):
                self.hide_usage = True
                if ctx.policy.streaming.observe_usage:
                    self._inject = True
                    if "stream_options" not in body:  # the client's bytes, the option spliced in
                        raw = with_usage_option(raw)
                    body = {**body, "stream_options": {**options, "include_usage": True}}
        self.body, self.raw = body, raw
        self.forwarded = forward_request_headers(ctx.headers)
        self._max_tokens = ctx.policy.translation.default_max_tokens
        self._target: Target | None = None
        self._built: UpstreamRequest | None = None
        self._crossing: Bridge | None = None

    def crossing(self, target: Target) -> Bridge | None:
        """The translation between the client's API and ``target``'s upstream's (None: the
        same API)."""
        if target is self._target:
            return self._crossing
        return bridge(self._api, self._api_of(target), self.ctx.kind)

    def early(self, targets: Sequence[Target]) -> Translator | None:
        """A translated stream's translator, made before any upstream answers so that its
        opening events (Translator.head) go out when one accepts; only where every target
        crosses the same way to the same model, so the opening holds whichever answers."""
        crossing, model = self.crossing(targets[0]), targets[0].model
        if crossing is None or any(self.crossing(t) is not crossing or t.model != model
                                   for t in targets[1:]):
            return None
        return crossing.stream(self.ctx.body)

    def _api_of(self, target: Target) -> str:
        """The API ``target``'s upstream is spoken to in: its own, or Responses as it came
        to an upstream that serves it natively."""
        upstream = self._upstreams[target.upstream]
        if upstream.native_responses and self._api == "responses":
            return "responses"
        return upstream.api

    def _translatable(self) -> dict[str, Any]:
        """The client's body as a translation reads it: a Responses request's hosted tools
        left out when the policy drops them (once said in the answer's headers and the log
        line's ``dropped_tools``)."""
        ctx = self.ctx
        if self._api != "responses" or ctx.policy.translation.hosted_tools != "drop":
            return ctx.body
        body, dropped = without_hosted_tools(ctx.body)
        if dropped and not self._dropped_said:
            self._dropped_said = True
            ctx.record.dropped_tools = list(dropped)
            ctx.response_headers.append((b"x-gateway-dropped-tools",
                                         ", ".join(dropped).encode()))
        return body

    def request(self, target: Target) -> UpstreamRequest:
        """The request for ``target`` (the same object for each of its attempts)."""
        if target is self._target and self._built is not None:
            return self._built
        ctx, shape = self.ctx, self.ctx.shape_body
        up_api = self._api_of(target)
        crossing = bridge(self._api, up_api, ctx.kind)
        path = ctx.path
        state = ctx.upstream_state
        try:
            if state is not None and state.upstream == target.upstream and crossing is None:
                # the upstream keeps the conversation: the client's request, its id forwarded
                payload = jsonio.dumps({**state.body, "model": target.model})
            elif crossing is not None:
                path = crossing.path
                out = crossing.request(self._translatable(), target.model, self._max_tokens)
                payload = jsonio.dumps(out if shape is None else shape(out, up_api))
            elif shape is not None:
                payload = jsonio.dumps(shape({**self.body, "model": target.model}, up_api))
            elif target.model == self.body["model"] and (
                    not self._inject or self.raw is not ctx.raw):
                # the client's bytes (carrying the usage option when it is injected)
                payload = self.raw
            else:
                payload = jsonio.dumps({**self.body, "model": target.model})
        except orjson.JSONEncodeError as exc:  # the door held the client's body to 254 levels
            raise InvalidRequest("the request is nested too deeply to be sent to this model "
                                 "(at most 254 levels once translated or shaped)",
                                 code="invalid_value") from exc
        built = UpstreamRequest("POST", path, payload, self.forwarded, ctx.stream,
                                ctx.request_id)
        self._target, self._built, self._crossing = target, built, crossing
        return built


def observe(status: int, obj: Any, ctx: RequestContext) -> None:
    """What a complete response says (``obj``: its body parsed, None when not JSON), OpenAI's
    or Anthropic's: error type and code into the log line; usage and ``finish_reason`` into
    the context."""
    rec = ctx.record
    if not isinstance(obj, dict):
        if status >= 400:
            rec.error_type = "upstream_error"
        return
    if status >= 400:
        error = obj.get("error")
        rec.error_type = error.get("type") if isinstance(error, dict) else "upstream_error"
        rec.error_code = error.get("code") if isinstance(error, dict) else None
        return
    rec.error_type = rec.error_code = None
    usage = obj.get("usage")
    if isinstance(usage, dict):
        found = Usage.of(usage)
        if found is not None:
            ctx.usage = found
    elif "usageMetadata" in obj:  # Gemini's (its finish is read from the translated answer)
        ctx.usage = gemini_usage(obj["usageMetadata"]) or ctx.usage
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[-1], dict):
        ctx.finish_reason = choices[-1].get("finish_reason")
    elif "stop_reason" in obj:
        ctx.finish_reason = finish_reason_of(obj["stop_reason"])
    elif obj.get("object") == "response":  # OpenAI Responses, from a native upstream
        ctx.finish_reason = response_finish_reason(obj)
