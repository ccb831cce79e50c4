"""One canonical path per request, resolved at the door before any routing.

Every spelling of a path is resolved to one form, and routing, limits, metrics and the
pass-through's upstream URL all read that form, so that no spelling of a model endpoint
reaches anything but that endpoint (issue 45, finding 1): ``/v1/./chat/completions``,
``/v1/%2E/chat/completions``, ``/v1//chat/completions`` and ``/v1/chat/completions/`` are
all ``/v1/chat/completions``.

From the request's raw path (the bytes on the wire; the decoded ``scope["path"]`` when the
server gives none), in order (RFC 3986 5.2.4, as WHATWG URL and Go's ``path.Clean`` do):

1. percent-decoded once, as UTF-8;
2. empty segments (repeated and trailing slashes) and ``.`` segments dropped;
3. each ``..`` removes the segment before it.

An encoded slash (``%2F``) is a slash: the path is split into segments only once decoded,
and every decision (routing, the pass-through's allow-list and object ids) and the
upstream URL (:func:`encode_segments`) read those segments, so no segment holds a slash
anywhere and none means one thing here and another upstream.

Refused with 400 (``code = "invalid_path"``), never guessed at: a ``\\`` (``%5C`` too:
some servers take it for ``/``, and a segment ``..\\..`` would climb there), a ``%`` left
after decoding (double encoding, which a server that decodes twice would read otherwise,
or an escape that is not one), a control character, bytes that are not UTF-8, a path not
starting with ``/``, and a ``..`` that climbs above the root (``/v1/..%2F..%2Fadmin``).

The hot path never comes here: a model endpoint's exact raw path (one dict lookup,
:class:`gateway.app.GatewayApp`) is already canonical.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote_to_bytes

from gateway.errors import InvalidRequest

__all__ = ["DEFAULT_PASSTHROUGH", "RESERVED", "BadPath", "Pattern", "canonical_path",
           "encode_segments", "segments_of"]

#: Bytes that send a raw path the long way: escapes, dot and empty segments, backslashes.
_SUSPECT = (b"%", b"/.", b"//", b"\\")
#: Characters refused in a decoded path: a backslash, a percent sign (see above), control
#: characters (C0 and DEL).
_REFUSED = re.compile(r"[\x00-\x1f\x7f\\%]")


class BadPath(InvalidRequest):
    """A path that has no canonical form (see the module docstring): 400."""

    code = "invalid_path"


def canonical_path(raw: bytes | None, decoded: str) -> str:
    """The canonical form of a request path: ``raw``, the raw path (ASGI ``raw_path``,
    without the query), or when None, ``decoded`` (``scope["path"]``). Raises
    :class:`BadPath` (400)."""
    if raw is None:  # decoded by the server already: not decoded again
        text = decoded
    else:
        if not any(s in raw for s in _SUSPECT) and len(raw) > 1 and not raw.endswith(b"/") \
                and raw.startswith(b"/"):
            try:  # already canonical (every path the gateway serves is written so)
                text = raw.decode("ascii")
            except UnicodeDecodeError:
                text = ""
            if text and _REFUSED.search(text) is None:
                return text
        try:
            text = unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise BadPath("the request path is not UTF-8 once percent-decoded") from None
    if not text.startswith("/"):
        raise BadPath("the request path must start with '/'")
    if _REFUSED.search(text) is not None:
        raise BadPath("the request path holds a character that is not allowed once "
                      "percent-decoded (a control character, '\\' or '%')")
    out: list[str] = []
    for segment in text.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not out:
                raise BadPath("the request path climbs above the root ('..')")
            out.pop()
        else:
            out.append(segment)
    return "/" + "/".join(out)


def segments_of(path: str) -> list[str]:
    """A canonical path's segments (``/v1/files/x`` -> ``["v1", "files", "x"]``)."""
    return path[1:].split("/") if len(path) > 1 else []


def encode_segments(segments: list[str]) -> str:
    """Segments joined as a path, each percent-encoded as one segment (every byte but
    RFC 3986's unreserved characters), so none can add a ``/``, a query or a fragment:
    ``["files", "a b"]`` -> ``/files/a%20b``."""
    return "".join("/" + quote(s, safe="") for s in segments)


#: First segments under ``/v1`` the gateway serves itself (its model endpoints, stored
#: responses, the model list): never passed through, whatever an allow-list says.
RESERVED = frozenset({"responses", "messages", "models", "completions", "embeddings"})

#: The pass-through paths an ``openai`` upstream allows when its config names none: the
#: provider's stateless endpoints, whose answer is the whole result and which keep nothing
#: an id could fetch later (moderations, audio, images; vLLM's and Cohere-style rerank and
#: score). Stateful objects (files, batches, vector stores, stored completions...) are left
#: out: under one shared upstream key every tenant would see them (gateway.ownership).
DEFAULT_PASSTHROUGH = (
    "/v1/moderations",
    "/v1/audio/speech", "/v1/audio/transcriptions", "/v1/audio/translations",
    "/v1/images/generations", "/v1/images/edits", "/v1/images/variations",
    "/v1/rerank", "/v1/score",
)


class Pattern:
    """A pass-through allow-list entry: a canonical path under ``/v1`` whose segments are
    literal, ``*`` (any one segment) or, last, ``**`` (any number of segments, none
    included): ``/v1/moderations``, ``/v1/files/**``, ``/v1/vector_stores/*/search``.
    Raises ValueError for anything else, and for a pattern whose first segment under
    ``/v1`` is a wildcard or one the gateway serves itself (:data:`RESERVED`)."""

    __slots__ = ("segments", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        segments = text.split("/")[1:] if text.startswith("/") else []
        if len(segments) < 2 or segments[0] != "v1":
            raise ValueError(f"pass-through pattern {text!r} must start with '/v1/'")
        for i, segment in enumerate(segments):
            if segment in ("", ".", "..") or _REFUSED.search(segment) or any(
                    c in segment for c in "?#") or ("*" in segment and segment not in (
                        "*", "**")) or (segment == "**" and i != len(segments) - 1):
                raise ValueError(f"pass-through pattern {text!r}: segment {segment!r} is "
                                 "not a canonical literal, '*' or a final '**'")
        if segments[1] in ("*", "**") or segments[1] in RESERVED:
            raise ValueError(f"pass-through pattern {text!r}: '/v1/{segments[1]}' is not a "
                             "pass-through path (a wildcard, or served by the gateway)")
        self.segments = tuple(segments)

    def matches(self, segments: list[str]) -> bool:
        """Whether a canonical path's segments (:func:`segments_of`) match."""
        own = self.segments
        if own[-1] == "**":
            own = own[:-1]
            if len(segments) < len(own):
                return False
        elif len(segments) != len(own):
            return False
        return all(p == "*" or p == s for p, s in zip(own, segments, strict=False))
