"""The compression bench's data: NQ-open 20-document contexts built as lost-in-the-middle
does (Liu et al., TACL 2024) and KV retrieval records, split dev/test by SHA-1 (see
``bench/compression.py``), and the baselines held against the compressor (truncation,
random document drop)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "compression"
POSITIONS = (1, 5, 10, 15, 20)
DOCS = 20
KV_QUESTION = 'Key: "{key}"'


def is_dev(text: str) -> bool:
    return hashlib.sha1(text.encode()).hexdigest()[0] in "01234567"


def normalize(text: str) -> str:
    """SQuAD's answer normalisation, as lost-in-the-middle scores NQ, padded with a space
    on each side so that containment matches whole words."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return f" {' '.join(text.split())} "


PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True)
class Item:
    question: str
    answers: tuple[str, ...]
    gold: str  # "(Title: t) text"
    distractors: tuple[str, ...]

    def documents(self, position: int) -> list[str]:
        docs = [*self.distractors]
        docs.insert(position - 1, self.gold)
        return [f"Document [{i}]{doc}" for i, doc in enumerate(docs, 1)]

    def context(self, position: int) -> str:
        return "\n".join(self.documents(position))


def nq_items(dev: bool, limit: int | None) -> list[Item]:
    with gzip.open(DATA / "nq_open_oracle.jsonl.gz", "rt") as f:
        rows = [r for r in map(json.loads, f) if is_dev(r["question"]) == dev]
    passages = [f"(Title: {r['ctxs'][0]['title']}) {r['ctxs'][0]['text']}" for r in rows]
    normal = [normalize(p) for p in passages]
    items = []
    for i, row in enumerate(rows[:limit]):
        answers = tuple(a for a in map(normalize, row["answers"]) if a.strip())
        rng = random.Random(hashlib.sha1(row["question"].encode()).hexdigest())
        pool = [j for j in range(len(rows)) if j != i and passages[j] != passages[i]
                and not any(a in normal[j] for a in answers)]
        if len(pool) < DOCS - 1:  # an answer found nearly everywhere ("1", "yes")
            continue
        picked = rng.sample(pool, DOCS - 1)
        items.append(Item(row["question"], tuple(row["answers"]), passages[i],
                          tuple(passages[j] for j in picked)))
    return items


def kv_items(dev: bool, limit: int | None) -> list[dict[str, Any]]:
    with gzip.open(DATA / "kv_retrieval_75_keys.jsonl.gz", "rt") as f:
        return [r for r in map(json.loads, f) if is_dev(r["key"]) == dev][:limit]


def kv_context(records: list[list[str]]) -> str:
    """lost-in-the-middle's formatting of the records (one per line, one JSON object)."""
    last = len(records) - 1
    return "".join(("{" if i == 0 else " ") + f'"{k}": "{v}"' + (",\n" if i != last else "}")
                   for i, (k, v) in enumerate(records))


def rate(hits: list[bool]) -> float:
    return round(sum(hits) / len(hits), 4) if hits else float("nan")


def truncate(text: str, tokens: int, encoding: Any) -> str:
    return str(encoding.decode(encoding.encode(text, disallowed_special=())[:tokens]))


def random_drop(item: Item, position: int, tokens: int, count: Any, rng: random.Random
                ) -> str:
    """Documents drawn in a random order, each kept if it still fits ``tokens``; written in
    the context's order."""
    docs = item.documents(position)
    order = list(range(len(docs)))
    rng.shuffle(order)
    kept, spent = [], 0
    for i in order:
        cost = count(docs[i] + "\n")
        if spent + cost <= tokens:
            kept.append(i)
            spent += cost
    return "\n".join(docs[i] for i in sorted(kept))
