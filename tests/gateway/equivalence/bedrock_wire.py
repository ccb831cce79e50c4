"""The harness's fake Bedrock (a :class:`~gateway.testing.fake_bedrock.FakeBedrock` recorder
behind the ``eq-bedrock`` and ``eq-bedrock-converse`` upstreams) seen as the runner reads
recorders (``records``, ``clear``):

- :class:`AnthropicRecords`: the Anthropic recorder's records, and each InvokeModel request
  read back as the Messages body an Anthropic upstream would have received
  (:func:`as_messages_record`: ``model`` from the URL path, ``stream`` from it too,
  ``anthropic_version`` removed, the ``anthropic_beta`` list back as the ``anthropic-beta``
  header), so the same contract holds for the ``claude-bedrock`` model as for ``claude``
  (B1 in :mod:`~tests.gateway.equivalence.contract`);
- :class:`ConverseRecords`: the Converse requests as they came (a translated direction's);
- :func:`wire_error`: what Bedrock would refuse in a recorded request whatever the client
  asked (a wrong signature, an InvokeModel body's Bedrock keys, a Converse body's shape): a
  failure of the gateway's even where the client was told a 4xx;
- :func:`converse_as_messages`: a Converse body read as Messages (its tools for T1).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

from gateway.formats.converse import JSON_TOOL
from gateway.testing.fake_bedrock import AwsError, FakeBedrock
from gateway.testing.fake_converse import as_messages
from gateway.testing.fake_upstream import Record

__all__ = ["AnthropicRecords", "ConverseRecords", "Recording", "as_messages_record",
           "converse_as_messages", "wire_error"]

_PATH = re.compile(r"^/model/([^/]+)/([a-z-]+)$")


class Recording(Protocol):
    """What the runner reads of a recorder."""

    @property
    def records(self) -> list[Record]: ...

    def clear(self) -> None: ...


def _action(rec: Record) -> tuple[str, str]:
    found = _PATH.match(rec.path)
    return (unquote(found.group(1)), found.group(2)) if found else ("", "")


def as_messages_record(rec: Record) -> Record:
    """An InvokeModel request ``rec`` as the Anthropic upstream's ``/v1/messages`` would
    have been recorded (its integers kept exact; a body that is no object kept as it is)."""
    model, action = _action(rec)
    try:
        data = json.loads(rec.body)
    except (ValueError, RecursionError):
        return rec
    if not isinstance(data, dict):
        return rec
    body = {"model": model, **{k: v for k, v in data.items()
                               if k not in ("anthropic_version", "anthropic_beta")}}
    if action == "invoke-with-response-stream":
        body["stream"] = True
    headers = dict(rec.headers)
    beta = data.get("anthropic_beta")
    if isinstance(beta, list) and beta:
        headers["anthropic-beta"] = ",".join(map(str, beta))
    return dataclasses.replace(rec, path="/v1/messages", headers=headers,
                               body=json.dumps(body).encode(), json=body)


@dataclass
class AnthropicRecords:
    """The Anthropic recorder and the fake Bedrock's InvokeModel requests, read back."""

    anthropic: Recording
    bedrock: FakeBedrock

    @property
    def records(self) -> list[Record]:
        invoked = [as_messages_record(r) for r in self.bedrock.records
                   if _action(r)[1].startswith("invoke")]
        return [*self.anthropic.records, *invoked]

    def clear(self) -> None:
        self.anthropic.clear()
        self.bedrock.clear()


@dataclass
class ConverseRecords:
    """The fake Bedrock's Converse and ConverseStream requests."""

    bedrock: FakeBedrock

    @property
    def records(self) -> list[Record]:
        return [r for r in self.bedrock.records if _action(r)[1].startswith("converse")]

    def clear(self) -> None:
        self.bedrock.clear()


def wire_error(bedrock: FakeBedrock, rec: Record | None) -> str | None:
    """Why Bedrock would refuse ``rec`` whatever the client asked, if it would."""
    if rec is None:
        return None
    error: AwsError | None = bedrock.wire_error(rec)
    if error is None:
        return None
    return f"Bedrock would refuse what the gateway sent ({error.name}: {error.message[:200]})"


def converse_as_messages(rec: Record) -> dict[str, Any] | None:
    """A Converse request's body read as Messages, without the forced tool a structured
    output is asked through (None: it does not read)."""
    model, _ = _action(rec)
    try:
        body = as_messages(model, rec.json)
    except (AwsError, KeyError, TypeError, AttributeError):
        return None
    forced = ((rec.json.get("toolConfig") or {}).get("toolChoice") or {}).get("tool") or {}
    if forced.get("name") == JSON_TOOL and isinstance(body.get("tools"), list):
        body["tools"] = [t for t in body["tools"] if t.get("name") != JSON_TOOL]
    return body
