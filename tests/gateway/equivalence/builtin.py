"""A small corpus generated here (no shared data needed, so it always runs), in the shared
data's layouts and with what a volatility detector could mistake for volatile text:

- ``retrieval``: 20 documents in the system prompt (lost-in-the-middle's layout), several
  holding dates ("... took place on February 4, 2018 ...", "... born January 2, 1926 ..."),
  the question as the user message; and the same all in one user message;
- ``agent``: a τ-bench-like agent (a long policy with "The current time is 2024-05-15
  15:00:00 EST." standing alone, tools, tool calls and results), one request per turn;
- ``kv``: a KV-retrieval JSON object of 75 records and ``Key: "..."``;
- ``structured``: a system prompt with dates in a Markdown list, a table, a fenced code
  block, a JSON block and an XML-tagged ``<document>`` (none may move), and a standalone
  "Current date: ..." line (which may);
- ``family``: requests whose system prompts differ only in one line ("Weather in Paris:
  ..."), sent in order: the traffic shows that line to change, so it may move
  (:mod:`~tests.gateway.equivalence.evidence`);
- ``chat``: a short chat, and one with the client's own ``prompt_cache_key`` (G3).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

from tests.gateway.equivalence.corpus import (
    INSTRUCTION,
    KV_INSTRUCTION,
    MAX_TOKENS,
    Item,
    kv_json,
    nq_document,
)

__all__ = ["DATED", "FAMILY", "NOW", "TOOLS", "builtin_items"]

NOW = "The current time is 2024-05-15 15:00:00 EST."
RULES = "\n\n".join(f"Rule {i}: when a traveller asks about booking change number {i}, check the "
                    "fare rules first, explain the fees in full sentences and ask for a clear "
                    "yes before any change is made." for i in range(1, 41))
DATED = [
    ("Super Bowl LII", ("Super Bowl LII was an American football game played to determine the "
                        "champion of the National Football League (NFL) for the 2017 season. "
                        "The game took place on February 4, 2018 at U.S. Bank Stadium in "
                        "Minneapolis, Minnesota.")),
    ("Marilyn Monroe", ("Marilyn Monroe was an American actress. She was born Norma Jeane "
                        "Mortenson on June 1, 1926 in Los Angeles and died on August 4, 1962.")),
    ("Kinshasa", ("Kinshasa is the capital of the Democratic Republic of the Congo. The city's "
                  "mayor since 2019 is Gentiny Ngobila; its census of 15 May 2024 counted 17 "
                  "million.")),
    ("Mel Brooks", ("Mel Brooks is an American actor, comedian and filmmaker, born January 2, "
                    "1926... Current date: 2024-05-15 in the archive that holds his letters.")),
    ("Apollo 11", ("Apollo 11 landed on the Moon on July 20, 1969 at 20:17 UTC; Armstrong "
                   "stepped out six hours later.")),
]
FAMILY = [f"Weather in Paris: {weather}" for weather in ("sunny", "rain", "snow", "fog")]
TOWNS = ["Oakridge", "Millbrook", "Cedar Hollow", "Fairhaven", "Riverton", "Ashford",
         "Brookfield", "Clearwater", "Dunmore", "Elmstead", "Glenwood", "Hillcrest", "Ironbridge",
         "Juniper Bay", "Kingsport"]
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{text} Use it only after the traveller confirms.",
    "parameters": {"type": "object", "required": ["reservation_id"], "properties": {
        "reservation_id": {"type": "string", "description": "Such as '8JX2WO'."},
        "amount": {"type": "number", "minimum": 0}}}}}
    for name, text in [("get_reservation_details", "Get the details of a reservation."),
                       ("cancel_reservation", "Cancel the whole reservation."),
                       ("book_reservation", "Book a reservation."),
                       ("send_certificate", "Send a certificate to the user.")]]
STRUCTURED = f"""# Assistant for the archive

Current date: 2024-05-15

Answer from the material below and cite it.

Release notes, in order:
- 2024-05-14: the search index was rebuilt
- 2024-05-15 09:00: the archive opened

| date | event |
|---|---|
| 2024-05-15 | audit |
| 2024-05-16 | release |

```python
RELEASED = "2024-05-15 10:00:00"
```

{{"updated": "2024-05-15T10:00:00Z", "version": 3}}

<document title="audit">
Today is 2024-05-15.
The audit ran on May 15, 2024 at 10:00.
</document>

    Last reviewed: 2024-05-15

{RULES}"""


def _documents() -> list[str]:
    rng = random.Random(27)
    towns = [(town, (f"{town} is a small town on route A{i + 7} founded in 18{i + 10}, with a "
                     f"population of {1000 + 137 * i:,}. Its council meets every second Tuesday "
                     "at the old hall on Station Road, and its economy rests on farming, a "
                     "weekly market and a little tourism along the river, whose bridge was "
                     "rebuilt after the great flood. The town has a primary school, two "
                     "churches, a cricket ground and a library open three days a week."))
             for i, town in enumerate(TOWNS)]
    passages = [*DATED, *towns]
    rng.shuffle(passages)
    return [nq_document(i, t, x) for i, (t, x) in enumerate(passages, 1)]


def _retrieval() -> Iterator[Item]:
    documents = "\n".join(_documents())
    asked = "Question: when was the Super Bowl LII played?\nAnswer:"
    yield Item("builtin", "retrieval, documents in the system prompt", {"messages": [
        {"role": "system", "content": f"{INSTRUCTION}\n\n{documents}"},
        {"role": "user", "content": asked}]})
    yield Item("builtin", "retrieval, all in one user message", {"messages": [
        {"role": "user", "content": f"{INSTRUCTION}\n\n{documents}\n\n{asked}"}]})


def _agent() -> Iterator[Item]:
    system = f"# Airline Agent Policy\n\n{NOW}\n\n{RULES}"
    result = json.dumps({"reservation_id": "8JX2WO", "user_id": "mia_li_3668", "created_at":
                         "2024-05-14T09:12:00", "flights": [{"flight_number": "HAT136", "date":
                         "2024-05-20"}], "passengers": [{"first_name": "Mia", "last_name": "Li",
                                                         "dob": "1990-04-05"}]})
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi, I want to cancel reservation 8JX2WO."},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {
                "name": "get_reservation_details",
                "arguments": '{"reservation_id": "8JX2WO"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
        {"role": "assistant", "content": "I found it. Shall I cancel it?"},
        {"role": "user", "content": "Yes, cancel it please."},
    ]
    for n in range(1, len(turns) + 1):
        if turns[n - 1]["role"] != "assistant":
            yield Item("builtin", f"agent, the request after {n} turns", {
                "messages": [{"role": "system", "content": system}, *turns[:n]],
                "tools": TOOLS})


def _kv() -> Iterator[Item]:
    rng = random.Random(75)
    records = [[str(uuid.UUID(int=rng.getrandbits(128))), str(uuid.UUID(int=rng.getrandbits(128)))]
               for _ in range(75)]
    text = f"{KV_INSTRUCTION}\n\n{kv_json(records)}\n\nKey: \"{records[40][0]}\""
    yield Item("builtin", "kv retrieval", {"messages": [{"role": "user", "content": text}]})


def _structured() -> Iterator[Item]:
    yield Item("builtin", "structured system prompt", {"messages": [
        {"role": "system", "content": STRUCTURED},
        {"role": "user", "content": "When did the audit run?"}]})


def _family() -> Iterator[Item]:
    for line in FAMILY:
        yield Item("builtin", f"family, {line!r}", {"messages": [
            {"role": "system", "content": f"# Concierge\n\n{line}\n\n{RULES}"},
            {"role": "user", "content": "Should I take an umbrella?"}]})


def _chat() -> Iterator[Item]:
    yield Item("builtin", "short chat", {"messages": [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "Hello! What's 2 + 2?"}]})
    yield Item("builtin", "short chat, the client's own prompt_cache_key", {
        "prompt_cache_key": "my-conversation", "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "And 3 + 3?"}]})


def builtin_items() -> list[Item]:
    """Every built-in request, in the order they are sent (a family in its order)."""
    items = [*_retrieval(), *_agent(), *_kv(), *_structured(), *_family(), *_chat()]
    return [Item(i.source, i.name, {**i.body, "max_tokens": MAX_TOKENS}) for i in items]
