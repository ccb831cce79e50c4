"""Where a chat request's compressible context is: the current turn only, never the question,
never what the client marked for caching; both APIs."""

from __future__ import annotations

from gateway.compression.messages import plan, rewritten

DOCS = "\n".join(f"Document [{i}](Title: T{i}) Text of document number {i} about things."
                 for i in range(1, 6))
PROMPT = f"Answer from the documents.\n\n{DOCS}\n\nQuestion: what is in document 3?"


def texts(api: str, body: dict) -> list[str]:
    return [s.text for s in plan(api, body).segments]


def test_a_retrieval_prompt_pins_its_instruction_and_question():
    found = plan("openai", {"messages": [{"role": "user", "content": PROMPT}]})
    [segment] = found.segments
    assert found.question == "Question: what is in document 3?"
    pinned = [segment.text[a:b] for a, b in segment.pinned]
    assert pinned == ["Answer from the documents.", "Question: what is in document 3?"]


def test_a_short_message_or_one_without_context_gives_nothing():
    assert plan("openai", {"messages": [{"role": "user", "content": "hi"}]}).segments == []
    two = "Summarise.\n\nWhat is it?"
    assert plan("openai", {"messages": [{"role": "user", "content": two}]}).segments == []
    assert plan("openai", {"messages": "nope"}).segments == []


def test_only_the_current_turn_counts():
    body = {"messages": [
        {"role": "system", "content": DOCS},
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "It says things."},
        {"role": "user", "content": PROMPT.replace("3", "4")}]}
    [segment] = plan("openai", body).segments
    assert segment.owner is body["messages"][3]


def test_tool_results_are_segments_and_the_question_comes_from_the_last_user_text():
    body = {"messages": [
        {"role": "user", "content": "Find the population of Lyon."},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "s", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": DOCS}]}
    found = plan("openai", body)
    assert found.question == "Find the population of Lyon."
    assert texts("openai", body) == [DOCS]
    found.segments[0].write("short")
    assert body["messages"][2]["content"] == "short"


def test_the_compressed_request_is_a_copy_that_shares_what_it_does_not_rewrite():
    result = [{"type": "text", "text": DOCS}]
    body = {"model": "m", "tools": [{"name": "t"}], "messages": [
        {"role": "user", "content": "Find the population of Lyon."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "s",
                                           "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": result},
            {"type": "text", "text": "And?"}]}]}
    found = plan("anthropic", body)
    [segment] = found.segments
    assert segment.path == ("messages", 2, "content", 0, "content", 0)
    out = rewritten(body, [(segment, "short")])
    assert out["messages"][2]["content"][0]["content"] == [{"type": "text", "text": "short"}]
    assert result == [{"type": "text", "text": DOCS}]  # the client's body is untouched
    assert out["messages"][:2] == body["messages"][:2]
    assert out["messages"][0] is body["messages"][0] and out["tools"] is body["tools"]
    assert out["messages"][2]["content"][1] is body["messages"][2]["content"][1]


def test_anthropic_tool_result_blocks_and_cache_control_markers():
    marked = {"type": "tool_result", "tool_use_id": "a", "content": DOCS,
              "cache_control": {"type": "ephemeral"}}
    free = {"type": "tool_result", "tool_use_id": "b",
            "content": [{"type": "text", "text": DOCS + "\nmore"}]}
    body = {"messages": [
        {"role": "user", "content": "Find document 3."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "s",
                                           "input": {}}]},
        {"role": "user", "content": [marked, free, {"type": "text", "text": "And then?"}]}]}
    found = plan("anthropic", body)
    assert found.question == "And then?"
    assert [s.text for s in found.segments] == [DOCS + "\nmore"]  # the marked one is kept


def test_everything_up_to_the_last_marker_is_left_alone():
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": DOCS},
        {"type": "text", "text": DOCS, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": PROMPT}]}]}
    found = plan("anthropic", body)
    assert [s.owner for s in found.segments] == [body["messages"][0]["content"][2]]
    marker_on_last = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]}]}
    assert plan("anthropic", marker_on_last).segments == []


def test_the_system_prompt_only_when_asked_and_not_under_a_marker():
    question = {"role": "user", "content": "What is in document 3?"}
    body = {"messages": [{"role": "system", "content": DOCS}, question]}
    assert plan("openai", body).segments == []
    [segment] = plan("openai", body, system=True).segments
    assert segment.owner is body["messages"][0]
    blocks = [{"type": "text", "text": DOCS, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": DOCS + "\nmore"}]
    anthropic = {"system": blocks, "messages": [question]}
    assert [s.owner for s in plan("anthropic", anthropic, system=True).segments] == [blocks[1]]
    anthropic = {"system": DOCS, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in document 3?", "cache_control": {"type": "ephemeral"}}]}]}
    assert plan("anthropic", anthropic, system=True).segments == []
    assert plan("anthropic", {"system": DOCS, "messages": [question]},
                system=True).segments[0].key == "system"


def test_a_mid_conversation_system_message_is_never_compressed_and_its_marker_counts():
    """Anthropic's system-role messages inside ``messages`` (Claude Code's, after the user's
    turn): operator instructions, never a segment; a cache marker on one ends the prefix the
    client asked to cache, so nothing before it is compressed either."""
    turn = {"role": "user", "content": [{"type": "text", "text": PROMPT}]}
    note = {"role": "system", "content": [{"type": "text", "text": DOCS}]}
    found = plan("anthropic", {"messages": [turn, note]})
    assert [s.owner for s in found.segments] == [turn["content"][0]]
    assert found.question == "Question: what is in document 3?"
    marked = {"role": "system", "content": [
        {"type": "text", "text": DOCS, "cache_control": {"type": "ephemeral"}}]}
    assert plan("anthropic", {"messages": [turn, marked]}).segments == []
    assert plan("anthropic", {"system": DOCS, "messages": [turn, marked]},
                system=True).segments == []
