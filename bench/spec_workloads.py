"""Prompts for the speculative-decoding part of ``bench/engine.py``.

Input-grounded: the answer repeats, quotes or extracts from text given in the prompt (NQ-open
gold passages: repeat a passage, quote the sentence that answers a question, list the
passage's names; given code: rename, add docstrings, convert to a class), the workload
prompt lookup is for. Open chat: MT-Bench turn 1. Items split dev/test by SHA-1 of the
passage (or question) as ``bench/compression_data.py`` splits them: tune on dev, report on
test.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

CODE = [
    '''def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total += (v - m) ** 2
    return total / len(values)
''',
    '''def parse_line(line):
    key, _, value = line.partition("=")
    return key.strip(), value.strip()


def parse_config(text):
    config = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = parse_line(line)
        config[key] = value
    return config
''',
    '''def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        if i % 15 == 0:
            out.append("FizzBuzz")
        elif i % 3 == 0:
            out.append("Fizz")
        elif i % 5 == 0:
            out.append("Buzz")
        else:
            out.append(str(i))
    return out
''',
    '''def read_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, email = line.strip().split(",")
            users.append({"name": name, "age": int(age), "email": email})
    return users


def adults(users):
    return [u for u in users if u["age"] >= 18]
''',
]

CODE_TASKS = [
    "Rename every variable called `total` to `acc` and return the whole code.",
    "Add a one-line docstring to each function and return the whole code.",
    "Add type hints to every function signature and return the whole code.",
]

PASSAGE_TASKS = [
    "Repeat the following passage word for word.\n\n{passage}",
    ("Passage: {passage}\n\nQuote, exactly as written, the sentence of the passage that "
     "answers: {question}"),
    ("List every name of a person, place or organisation in this passage, each with the "
     "words around it, copied exactly.\n\n{passage}"),
]


def _is_dev(text: str) -> bool:
    return hashlib.sha1(text.encode()).hexdigest()[0] in "01234567"


def grounded(count: int, split: str = "test") -> list[str]:
    """``count`` input-grounded prompts, code edits and passage tasks interleaved."""
    code = [f"{task}\n\n```python\n{src}```" for src in CODE for task in CODE_TASKS]
    passages: list[str] = []
    with gzip.open(DATA / "compression" / "nq_open_oracle.jsonl.gz", "rt") as f:
        for line in f:
            item = json.loads(line)
            text = item["ctxs"][0]["text"]
            if _is_dev(text) != (split == "dev"):
                continue
            task = PASSAGE_TASKS[len(passages) % len(PASSAGE_TASKS)]
            passages.append(task.format(passage=text, question=item["question"]))
            if len(passages) >= count:
                break
    out: list[str] = []
    while len(out) < count:  # one code edit for every two passage tasks
        pool = code if len(out) % 3 == 2 and code else passages
        out.append(pool.pop(0))
    return out


def mt_bench(count: int, split: str = "test") -> list[str]:
    """MT-Bench turn-1 questions (80 in all: both splits together are 80)."""
    rows = [json.loads(line) for line in
            (DATA / "prompts" / "mt_bench_questions.jsonl").read_text().splitlines()]
    firsts = [r["turns"][0] for r in rows]
    chosen = [q for q in firsts if _is_dev(q) == (split == "dev")]
    return (chosen + [q for q in firsts if q not in chosen])[:count]
