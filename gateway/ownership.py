"""Which gateway key created which stateful provider object, so that tenants sharing one
upstream key reach only their own (issue 45, finding 2).

Every request a gateway forwards goes out under the upstream's key, so to the provider all
tenants are one account: key B could list, read or delete key A's files, batches, vector
stores... Their pass-through paths are off by default (gateway.paths.DEFAULT_PASSTHROUGH).
When an operator allows one for an upstream and gateway keys are configured, the
pass-through asks :meth:`Ownership.exchange` first:

- ``POST`` to a collection (``/v1/files``): a create; the ``id`` of its 2xx JSON answer is
  recorded as the key's (and the files a batch, a fine-tuning job or an upload names as
  its output: ``output_file_id``, ``error_file_id``, ``result_files``, ``file.id``, when
  the key reads its own).
- ``GET`` of a collection: its ``{"object": "list", "data": [...]}`` answer keeps only the
  key's objects (rebuilt: ``data``, ``first_id``, ``last_id``, ``has_more``; a page may
  come back shorter).
- a path naming an object (``/v1/files/{id}...``): only the key that created it; any other
  id is 404, as the provider says for an id it does not know. A 2xx ``DELETE`` of it
  forgets it.
- an id of such an object in the body (``input_file_id``, ``file_ids``...: any JSON string
  outside ``metadata``, or short form field, shaped as one, :data:`ID_SHAPE`) must be the
  key's too, else 404.

Records are kept in memory, per replica and per upstream, at most ``max_per_key`` ids per
key (its oldest forgotten first: one key cannot push out another's). Behind several
replicas, or after a restart, an object created through another replica is not found here
(a 404, never another key's object). Without gateway keys nothing is checked: one tenant.
Known gaps, by design small: stored chat completions are created by the model endpoint,
which records nothing (with keys, each key lists none and reads none); nested creates
(``/v1/threads/runs``, ``/v1/videos/{id}/remix``) are not recorded.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import orjson

from gateway.errors import NotFound

__all__ = ["FAMILIES", "ID_SHAPE", "Exchange", "Ownership"]

#: The provider's stateful collections (segments under ``/v1``), longest first: a path
#: under one names an object by the segment after it. A path under one of the roots that
#: no longer prefix names (``/v1/fine_tuning/alpha/...``) is checked as the root's.
FAMILIES = (
    ("fine_tuning", "jobs"), ("fine_tuning", "checkpoints"), ("chat", "completions"),
    ("files",), ("uploads",), ("batches",), ("vector_stores",), ("assistants",),
    ("threads",), ("containers",), ("conversations",), ("evals",), ("videos",),
    ("fine_tuning",), ("chat",), ("realtime",),
)
#: A string in a request body that names a stateful object (OpenAI's id prefixes).
ID_SHAPE = re.compile(r"(?:file|batch|upload|vsfb|vs|ftjob|ftckpt|asst|thread|cntr|cfile|"
                      r"conv|evalrun|eval|video|chatcmpl|resp)[-_][A-Za-z0-9_-]{3,200}")
_ID_IN_TEXT = re.compile(rb"(?<![A-Za-z0-9_-])(?:" + ID_SHAPE.pattern.encode() +
                         rb")(?![A-Za-z0-9_-])")
#: Families whose objects name files made for the key (their answers are read).
_DERIVED = {("batches",), ("fine_tuning", "jobs"), ("uploads",)}
#: The most a read answer may hold (bytes): lists and objects are far smaller.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


def family_of(segments: list[str]) -> tuple[str, ...] | None:
    """The stateful family of a path's segments under ``/v1``, or None."""
    for family in FAMILIES:
        if tuple(segments[:len(family)]) == family:
            return family
    return None


class Exchange:
    """One pass-through request to a stateful path, checked: :attr:`read` says whether its
    answer must be read whole and given to :meth:`answer` before the client gets it."""

    __slots__ = ("_family", "_key", "_kind", "_method", "_owners", "_rest", "_upstream", "read")

    def __init__(self, owners: Ownership, upstream: str, key: str, method: str,
                 family: tuple[str, ...], rest: list[str]) -> None:
        self._owners, self._upstream, self._key = owners, upstream, key
        self._method, self._family, self._rest = method, family, rest
        self._kind = "object" if rest else "create" if method == "POST" else "list"
        self.read = self._kind != "object" or (family in _DERIVED and method in ("GET", "POST"))

    def answer(self, status: int, body: bytes) -> bytes:
        """The answer the client gets: the same bytes, or a list's filtered; ids recorded
        or forgotten as it says."""
        if not 200 <= status < 300:
            return body
        if self._kind == "object" and self._method == "DELETE" and len(self._rest) == 1:
            self._owners.forget(self._upstream, self._rest[0])
        if not self.read:
            return body
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            if self._kind == "list":  # nothing we can filter: nothing shown
                return orjson.dumps({"object": "list", "data": [], "has_more": False})
            return body
        if self._kind == "create" and isinstance(obj.get("id"), str):
            self._owners.record(self._upstream, obj["id"], self._key)
        if self._kind != "list":
            self._record_derived(obj)
            return body
        data = obj.get("data")
        mine = [item for item in data if isinstance(item, dict) and self._owners.owner(
            self._upstream, item.get("id")) == self._key] if isinstance(data, list) else []
        for item in mine:
            self._record_derived(item)
        # Rebuilt, not edited: nothing else of the shared answer goes out.
        return orjson.dumps({"object": "list", "data": mine,
                             "first_id": mine[0].get("id") if mine else None,
                             "last_id": mine[-1].get("id") if mine else None,
                             "has_more": obj.get("has_more") is True})

    def _record_derived(self, obj: dict[str, Any]) -> None:
        if self._family not in _DERIVED:
            return
        found = [obj.get("output_file_id"), obj.get("error_file_id")]
        if isinstance(obj.get("result_files"), list):
            found += obj["result_files"]
        if isinstance(obj.get("file"), dict):
            found.append(obj["file"].get("id"))
        for oid in found:
            if isinstance(oid, str) and ID_SHAPE.fullmatch(oid):
                self._owners.record(self._upstream, oid, self._key)


class Ownership:
    """Object ids per (upstream, gateway key), in memory; see the module docstring."""

    def __init__(self, max_per_key: int = 10_000) -> None:
        self.max_per_key = max_per_key
        self._owner: dict[tuple[str, str], str] = {}
        self._by_key: dict[str, OrderedDict[tuple[str, str], None]] = {}

    def owner(self, upstream: str, oid: Any) -> str | None:
        """The key that created ``oid`` through ``upstream``, if recorded."""
        return self._owner.get((upstream, oid)) if isinstance(oid, str) else None

    def record(self, upstream: str, oid: str, key: str) -> None:
        """``oid`` is ``key``'s (an id another key holds stays that key's)."""
        ref = (upstream, oid)
        if self._owner.setdefault(ref, key) != key:
            return
        ids = self._by_key.setdefault(key, OrderedDict())
        ids[ref] = None
        ids.move_to_end(ref)
        while len(ids) > self.max_per_key:
            old, _ = ids.popitem(last=False)
            self._owner.pop(old, None)

    def forget(self, upstream: str, oid: str) -> None:
        key = self._owner.pop((upstream, oid), None)
        if key is not None:
            self._by_key[key].pop((upstream, oid), None)

    def exchange(self, upstream: str, key: str, method: str, segments: list[str],
                 body: bytes, content_type: bytes) -> Exchange | None:
        """Check a pass-through request by ``key`` to ``upstream``; ``segments``: its path's
        under ``/v1``. None when the path is not a stateful one; raises NotFound (404) when
        it names, in its path or its body, an object that is not the key's, or is a
        collection call other than a list or a create."""
        family = family_of(segments)
        if family is None:
            return None
        rest = segments[len(family):]
        if rest:
            if self.owner(upstream, rest[0]) != key:
                raise NotFound(f"No such object: '{rest[0]}'")
        elif method not in ("GET", "POST"):
            raise NotFound(f"{method} /v1/{'/'.join(segments)} is not available")
        for oid in _ids_in(body, content_type):
            if self.owner(upstream, oid) != key:
                raise NotFound(f"No such object: '{oid}'")
        return Exchange(self, upstream, key, method, family, rest)


def _ids_in(body: bytes, content_type: bytes) -> Iterator[str]:
    """The object ids a request body names: JSON strings shaped as ids (``metadata``, the
    client's own labels, left out), or, in a form, fields shaped as ids (not uploaded
    files' contents)."""
    if not body:
        return
    kind = content_type.split(b";")[0].strip().lower()
    if kind == b"multipart/form-data":
        boundary = content_type.partition(b"boundary=")[2].split(b";")[0].strip(b'" ')
        for part in body.split(b"--" + boundary) if boundary else ():
            head, _, value = part.partition(b"\r\n\r\n")
            if b"filename=" not in head and len(value) <= 1024:  # a field, not data
                yield from (m.decode() for m in _ID_IN_TEXT.findall(value))
        return
    if kind == b"application/x-www-form-urlencoded":
        yield from (m.decode() for m in _ID_IN_TEXT.findall(body))
        return
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    stack: list[Any] = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if ID_SHAPE.fullmatch(item):
                yield item
        elif isinstance(item, dict):
            stack.extend(v for k, v in item.items() if k != "metadata")
        elif isinstance(item, list):
            stack.extend(item)
