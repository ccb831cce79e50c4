"""Requests built from ../shared/data (never copied into the repository), as a client writes
them: OpenAI Chat Completions bodies without ``model`` (the harness sets it), and the
same requests for ``/v1/messages`` (:func:`anthropic_body`).

- τ-bench airline (``agent_traces/tau_airline_{dev,test}.jsonl``): one request per
  assistant turn, the history before it and the 14 tools of ``tau_airline_tools.json``.
- NQ-open (``compression/nq_open_oracle.jsonl.gz``): 20 documents, the item's gold passage
  among 19 other items' passages (drawn, and the gold's position chosen, with a seed from
  the question's SHA-1), one ``Document [i](Title: t) text`` a line, in two layouts:
  ``system`` (lost-in-the-middle's: the documents in the system prompt, the question as the
  user message) and ``user`` (instruction, documents and question in one user message).
- KV retrieval (``compression/kv_retrieval_75_keys.jsonl.gz``): the 75 records as
  lost-in-the-middle's JSON object, one record a line, and ``Key: "<key>"``.
- Chat prompts: each MT-Bench turn (the second after the first and a stand-in answer) and
  each Vicuna question.

Every builder yields :class:`Item` in the file's order, so a stride (``every``) is a
deterministic stratified sample. ``Item.name`` says where it came from (file, line, turn).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.formats.openai_to_anthropic import anthropic_request

__all__ = ["DATA", "INSTRUCTION", "KV_INSTRUCTION", "SOURCES", "Item", "anthropic_body",
           "chat_items", "kv_items", "kv_json", "nq_document", "nq_items", "tau_items"]

#: ../shared/data, next to the repository (absent on a bare CI checkout).
DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"

INSTRUCTION = ("Write a high-quality answer for the given question using only the provided "
               "search results (some of which might be irrelevant).")
KV_INSTRUCTION = ("Extract the value corresponding to the specified key in the JSON object "
                  "below.")
DOCUMENTS = 20
#: max_tokens of every request (Anthropic requires one; the OpenAI bodies carry it too).
MAX_TOKENS = 64


@dataclass(frozen=True)
class Item:
    """One request: where it comes from (``source``, ``name``) and its ``body`` (OpenAI
    chat, no ``model``)."""

    source: str
    name: str
    body: dict[str, Any]


def anthropic_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The same request for ``/v1/messages``: a string ``system``, ``tool_use`` and
    ``tool_result`` blocks, ``input_schema`` tools (the gateway's own translation, which
    has tests of its own: here it only writes inputs)."""
    return anthropic_request(body, model, MAX_TOKENS)


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


# -- τ-bench ------------------------------------------------------------------------------

def tau_items(data: Path = DATA) -> Iterator[Item]:
    tools = json.loads((data / "agent_traces" / "tau_airline_tools.json").read_text())
    for split in ("dev", "test"):
        path = data / "agent_traces" / f"tau_airline_{split}.jsonl"
        for line, row in enumerate(_jsonl(path), 1):
            messages = row["messages"]
            for turn, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                name = (f"{path.name} line {line} (task {row['task_id']}, trial "
                        f"{row['trial']}): the request before messages[{turn}]")
                yield Item("tau", name, {"messages": messages[:turn], "tools": tools,
                                         "max_tokens": MAX_TOKENS})


# -- NQ-open ------------------------------------------------------------------------------

def nq_document(i: int, title: str, text: str) -> str:
    return f"Document [{i}](Title: {title}) {text}"


def nq_items(layout: str, data: Path = DATA) -> Iterator[Item]:
    """``layout``: ``system`` (documents in the system prompt) or ``user`` (all in one user
    message)."""
    path = data / "compression" / "nq_open_oracle.jsonl.gz"
    for i, (question, documents) in enumerate(_nq_contexts(path)):
        asked = f"Question: {question}\nAnswer:"
        if layout == "system":
            messages = [{"role": "system", "content": f"{INSTRUCTION}\n\n{documents}"},
                        {"role": "user", "content": asked}]
        else:
            messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n{documents}\n\n{asked}"}]
        yield Item(f"nq-{layout}", f"{path.name} line {i + 1} ({layout} layout)",
                   {"messages": messages, "max_tokens": MAX_TOKENS})


@functools.cache
def _nq_contexts(path: Path) -> list[tuple[str, str]]:
    """Each item's (question, its 20 documents): the gold passage among 19 other items'
    (drawn, and the gold's position chosen, with a seed from the question's SHA-1). Built
    once: both layouts and every test read them."""
    rows = list(_jsonl(path))
    passages = [(r["ctxs"][0]["title"], r["ctxs"][0]["text"]) for r in rows]
    out = []
    for i, row in enumerate(rows):
        question = row["question"]
        rng = random.Random(hashlib.sha1(question.encode()).hexdigest())
        drawn = [j for j in rng.sample(range(len(rows)), DOCUMENTS + 9)
                 if passages[j] != passages[i]]
        docs = [passages[j] for j in drawn[:DOCUMENTS - 1]]
        docs.insert(rng.randrange(DOCUMENTS), passages[i])
        out.append((question, "\n".join(nq_document(k, t, x) for k, (t, x) in enumerate(docs, 1))))
    return out


# -- KV retrieval -------------------------------------------------------------------------

def kv_json(records: list[list[str]]) -> str:
    """lost-in-the-middle's JSON object: one ``"key": "value"`` a line."""
    last = len(records) - 1
    return "".join(("{" if i == 0 else " ") + json.dumps(k) + ": " + json.dumps(v)
                   + (",\n" if i != last else "}") for i, (k, v) in enumerate(records))


def kv_items(data: Path = DATA) -> Iterator[Item]:
    path = data / "compression" / "kv_retrieval_75_keys.jsonl.gz"
    for i, row in enumerate(_jsonl(path)):
        text = f"{KV_INSTRUCTION}\n\n{kv_json(row['ordered_kv_records'])}\n\nKey: \"{row['key']}\""
        yield Item("kv", f"{path.name} line {i + 1}",
                   {"messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS})


# -- chat prompts -------------------------------------------------------------------------

def chat_items(data: Path = DATA) -> Iterator[Item]:
    path = data / "prompts" / "mt_bench_questions.jsonl"
    for row in _jsonl(path):
        messages: list[dict[str, Any]] = []
        for turn, text in enumerate(row["turns"], 1):
            messages.append({"role": "user", "content": text})
            yield Item("chat", f"{path.name} question {row['question_id']} turn {turn}",
                       {"messages": list(messages), "max_tokens": MAX_TOKENS})
            messages.append({"role": "assistant", "content": f"(my answer to turn {turn})"})
    path = data / "prompts" / "vicuna_bench_questions.jsonl"
    for row in _jsonl(path):
        yield Item("chat", f"{path.name} question {row['question_id']}",
                   {"messages": [{"role": "user", "content": row["turns"][0]}],
                    "max_tokens": MAX_TOKENS})


#: Each source of the shared data: name -> its items.
SOURCES: dict[str, Callable[[], Iterator[Item]]] = {
    "tau": tau_items,
    "nq-system": lambda: nq_items("system"),
    "nq-user": lambda: nq_items("user"),
    "kv": kv_items,
    "chat": chat_items,
}
