"""The ``prompt_cache`` stage's machinery: make what a provider's prompt cache keys on
byte-stable from one request to the next, and tell Anthropic where to cache.

Provider prompt caches reuse only byte-identical prefixes (Anthropic:
https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching; OpenAI:
https://platform.openai.com/docs/guides/prompt-caching). One module per concept, pure
where possible:

- :mod:`~gateway.prompt_cache.canonical`: tools in a stable order, their JSON schemas' keys
  sorted, Anthropic bodies in the order tools, system, messages.
- :mod:`~gateway.prompt_cache.volatile`: spans of the system prompt and tool descriptions
  that change between requests (dates, times, ids, counters, the policy's own patterns),
  taken out of their text as notes.
- :mod:`~gateway.prompt_cache.memory`: what the gateway remembers of recent requests, per
  gateway key: line fingerprints (hashes, never text) to find lines that change, and the
  prefixes it cached, with when.
- :mod:`~gateway.prompt_cache.relocate`: the notes put at the very end of a request, in
  either API's shape.
- :mod:`~gateway.prompt_cache.breakpoints`: Anthropic ``cache_control`` markers, where and
  with which TTL.
- :mod:`~gateway.prompt_cache.shape`: one request's plan, and the function that shapes the
  body sent to each upstream.
"""
