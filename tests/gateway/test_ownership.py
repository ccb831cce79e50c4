"""Stateful provider objects per gateway key (gateway.ownership): who may name an id, what a
list shows, what is recorded and forgotten. (Over HTTP: tests/gateway/security/test_door.py.)"""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import NotFound
from gateway.ownership import Ownership

JSON = b"application/json"


def created(owners: Ownership, key: str, collection: str, oid: str,
            answer: dict | None = None) -> None:
    exchange = owners.exchange("up", key, "POST", [collection], b"{}", JSON)
    assert exchange is not None and exchange.read
    exchange.answer(200, orjson.dumps({"id": oid, **(answer or {})}))


def test_a_path_naming_another_keys_object_is_not_found() -> None:
    owners = Ownership()
    created(owners, "a", "files", "file-aaa1")
    assert owners.exchange("up", "a", "GET", ["files", "file-aaa1", "content"], b"", JSON)
    for key, oid in (("b", "file-aaa1"), ("a", "file-unknown")):
        with pytest.raises(NotFound, match=oid):
            owners.exchange("up", key, "GET", ["files", oid], b"", JSON)
    with pytest.raises(NotFound):  # another upstream is another account
        owners.exchange("other", "a", "GET", ["files", "file-aaa1"], b"", JSON)
    assert owners.exchange("up", "b", "POST", ["moderations"], b"", JSON) is None


def test_a_list_shows_only_the_keys_own_and_nothing_else_of_the_answer() -> None:
    owners = Ownership()
    created(owners, "a", "files", "file-aaa1")
    created(owners, "b", "files", "file-bbb1")
    exchange = owners.exchange("up", "b", "GET", ["files"], b"", JSON)
    assert exchange is not None
    answer = orjson.loads(exchange.answer(200, orjson.dumps({
        "object": "list", "data": [{"id": "file-aaa1"}, {"id": "file-bbb1"}, "junk"],
        "first_id": "file-aaa1", "last_id": "file-bbb1", "has_more": True,
        "secret": "file-aaa1"})))
    assert answer == {"object": "list", "data": [{"id": "file-bbb1"}], "first_id": "file-bbb1",
                      "last_id": "file-bbb1", "has_more": True}
    assert orjson.loads(exchange.answer(200, b"not json"))["data"] == []


@pytest.mark.parametrize(("body", "content_type"), [
    (b'{"input_file_id": "file-aaa1", "endpoint": "/v1/chat/completions"}', JSON),
    (b'{"tool_resources": {"file_search": {"vector_store_ids": ["x", "file-aaa1"]}}}', JSON),
    (b'--XX\r\nContent-Disposition: form-data; name="file_id"\r\n\r\nfile-aaa1\r\n--XX--',
     b"multipart/form-data; boundary=XX"),
    (b"file_id=file-aaa1", b"application/x-www-form-urlencoded"),
])
def test_a_body_naming_another_keys_object_is_not_found(body: bytes,
                                                         content_type: bytes) -> None:
    owners = Ownership()
    created(owners, "a", "files", "file-aaa1")
    with pytest.raises(NotFound, match="file-aaa1"):
        owners.exchange("up", "b", "POST", ["batches"], body, content_type)
    assert owners.exchange("up", "a", "POST", ["batches"], body, content_type) is not None


def test_metadata_and_uploaded_contents_are_not_read_as_ids() -> None:
    owners = Ownership()
    assert owners.exchange("up", "b", "POST", ["batches"],
                           b'{"metadata": {"ref": "file-aaa1"}, "note": "file-aaa1 x"}', JSON)
    upload = (b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
              b'\r\n{"custom_id": "file-aaa1"}\r\n--XX--')
    assert owners.exchange("up", "b", "POST", ["files"], upload,
                           b"multipart/form-data; boundary=XX")


def test_outputs_are_the_keys_and_a_delete_forgets() -> None:
    owners = Ownership()
    created(owners, "a", "batches", "batch_1")
    exchange = owners.exchange("up", "a", "GET", ["batches", "batch_1"], b"", JSON)
    assert exchange is not None and exchange.read
    exchange.answer(200, orjson.dumps({"id": "batch_1", "output_file_id": "file-out1",
                                       "error_file_id": None}))
    assert owners.owner("up", "file-out1") == "a"
    created(owners, "a", "uploads", "upload_1")
    done = owners.exchange("up", "a", "POST", ["uploads", "upload_1", "complete"], b"{}", JSON)
    assert done is not None
    done.answer(200, orjson.dumps({"id": "upload_1", "file": {"id": "file-up1"}}))
    assert owners.owner("up", "file-up1") == "a"
    gone = owners.exchange("up", "a", "DELETE", ["files", "file-out1"], b"", JSON)
    assert gone is not None and not gone.read
    gone.answer(404, b"")
    assert owners.owner("up", "file-out1") == "a"  # not deleted upstream: still the key's
    gone.answer(200, b"")
    assert owners.owner("up", "file-out1") is None


def test_a_key_keeps_at_most_its_own_share_and_cannot_take_another_keys_id() -> None:
    owners = Ownership(max_per_key=3)
    created(owners, "a", "files", "file-aaa1")
    for n in range(5):
        created(owners, "b", "files", f"file-bbb{n}")
    assert owners.owner("up", "file-aaa1") == "a"  # b's records pushed out only b's own
    assert [owners.owner("up", f"file-bbb{n}") for n in range(5)] == [None, None, "b", "b", "b"]
    owners.record("up", "file-aaa1", "b")
    assert owners.owner("up", "file-aaa1") == "a"


def test_collection_calls_other_than_list_and_create_are_refused() -> None:
    owners = Ownership()
    with pytest.raises(NotFound):
        owners.exchange("up", "a", "DELETE", ["files"], b"", JSON)
    with pytest.raises(NotFound):  # stored completions are made by the model endpoint
        owners.exchange("up", "a", "GET", ["chat", "completions", "chatcmpl-1"], b"", JSON)
