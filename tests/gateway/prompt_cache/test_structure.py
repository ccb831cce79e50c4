"""Which lines stand on their own: outside documents, lists, tables, code, JSON and tags."""

from __future__ import annotations

from gateway.prompt_cache.structure import standalone

TEXT = """# Agent
You are an agent.
Current date: 2024-05-15

- item one
  continued
1. first


| a | b |
> quoted
```python
x = 1
```
after the code

{"a": [1,
  2]}
<context source="x">
inside
</context>
between

Document [1](Title: A) text
more of the document

last line"""


def test_each_line_is_marked():
    marks = dict(zip(TEXT.split("\n"), standalone(TEXT.split("\n")), strict=True))
    alone = {line for line, ok in marks.items() if ok and line}
    assert alone == {"# Agent", "You are an agent.", "Current date: 2024-05-15",
                     "after the code", "between", "last line"}


def test_an_unclosed_fence_runs_to_the_end_and_brackets_in_quotes_do_not_count():
    assert standalone(["```", "a", "b"]) == [False, False, False]
    assert standalone(['Say "{" politely.', "next"]) == [True, True]
    assert standalone(["Use [1] for the first.", "next"]) == [True, True]
