"""The user's text by the two rules the gateway reads it: the cache's and the router's."""

from __future__ import annotations

import pytest

from gateway.formats.chat_text import final_user_text, last_user_text

IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}


@pytest.mark.parametrize(("messages", "cache", "router"), [
    pytest.param([{"role": "user", "content": "hi"}], "hi", "hi", id="plain"),
    pytest.param([{"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}],
                 "a\nb", "a\nb", id="text-parts-joined"),
    # a tool result last: the cache can only hit exactly; the router reads the question
    pytest.param([{"role": "user", "content": "Population of Lyon?"},
                  {"role": "assistant", "content": None},
                  {"role": "tool", "tool_call_id": "c", "content": "513,275"}],
                 None, "Population of Lyon?", id="tool-result-last"),
    # an image: never compared by meaning; its text still says how hard the request is
    pytest.param([{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                               IMAGE]}],
                 None, "What is it?", id="image"),
    pytest.param([], None, "", id="empty"),
])
def test_the_cache_and_the_router_read_the_user_differently(messages, cache, router):
    assert final_user_text(messages) == cache
    assert last_user_text(messages) == router
