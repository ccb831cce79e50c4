"""Cache keys and scopes: what may and may not share an answer."""

from __future__ import annotations

from typing import Any

from gateway.cache.keys import CacheKey, ineligible_reason
from gateway.cache.keys import cache_key as keys_of
from gateway.formats.chat_text import final_user_text


def cache_key(data: dict[str, Any], namespace: str, model: str) -> CacheKey:
    """The keys as the cache makes them: the query read by the cache's rule."""
    return keys_of(data, namespace, model, final_user_text(data["messages"]))


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"}]}
    return {**base, **overrides}


def test_stream_and_user_do_not_change_the_key() -> None:
    a = cache_key(request(), "ns", "m")
    b = cache_key(request(stream=True, stream_options={"include_usage": True}, user="u1"),
                  "ns", "m")
    assert a == b


def test_any_other_field_changes_the_exact_key_even_unknown_ones() -> None:
    a = cache_key(request(), "ns", "m")
    for change in ({"temperature": 0.2}, {"max_tokens": 5}, {"seed": 1},
                   {"a_field_added_next_year": True}):
        assert cache_key(request(**change), "ns", "m").exact != a.exact


def test_scope_separates_what_must_not_share_answers() -> None:
    a = cache_key(request(), "ns", "m")
    assert a.query == "What is the capital of France?"
    assert cache_key(request(), "other", "m").scope != a.scope
    assert cache_key(request(), "ns", "m2").scope != a.scope
    assert cache_key(request(tools=[{"type": "function"}]), "ns", "m").scope != a.scope
    assert cache_key(request(response_format={"type": "json_object"}), "ns",
                     "m").scope != a.scope
    system = request(messages=[{"role": "system", "content": "Be verbose."},
                               {"role": "user", "content": "What is the capital of France?"}])
    assert cache_key(system, "ns", "m").scope != a.scope
    history = request(messages=[{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "hello"},
                                {"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "What is the capital of France?"}])
    assert cache_key(history, "ns", "m").scope != a.scope
    # a system message later in the conversation counts where it was said
    moved = request(messages=[{"role": "user", "content": "hi"},
                              {"role": "system", "content": "Be brief."},
                              {"role": "assistant", "content": "hello"},
                              {"role": "user", "content": "What is the capital of France?"}])
    assert cache_key(moved, "ns", "m").scope != cache_key(history, "ns", "m").scope
    # the question itself and max_tokens are compared by meaning / checked at hit time
    other_q = request(messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Capital of France?"}])
    assert cache_key(other_q, "ns", "m").scope == a.scope
    assert cache_key(request(max_tokens=50), "ns", "m").scope == a.scope


def test_only_a_final_text_user_turn_is_compared_by_meaning() -> None:
    tool_turn = request(messages=[{"role": "user", "content": "x"},
                                  {"role": "tool", "content": "42", "tool_call_id": "t"}])
    assert cache_key(tool_turn, "ns", "m").scope is None
    image = request(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert cache_key(image, "ns", "m").scope is None
    parts = request(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert cache_key(parts, "ns", "m").query == "hi"


def test_eligibility() -> None:
    assert ineligible_reason(request(), 1.0) is None
    assert ineligible_reason(request(temperature=1.2), 1.0) == "temperature"
    assert ineligible_reason(request(), 0.5) == "temperature"  # the API default is 1
    assert ineligible_reason(request(temperature=0), 0.5) is None
    assert ineligible_reason(request(n=3), 1.0) == "n"
    assert ineligible_reason(request(logprobs=True), 1.0) == "logprobs"
    assert ineligible_reason(request(tool_choice="required"), 1.0) == "tool_choice"
    assert ineligible_reason(request(tool_choice={"type": "function",
                                                  "function": {"name": "f"}}), 1.0)
    assert ineligible_reason(request(tool_choice="auto"), 1.0) is None
