"""Stored responses of ``/v1/responses``: what makes ``previous_response_id`` and
``GET /v1/responses/{id}`` work on every upstream.

- :mod:`.records`: where records live (in memory, LRU and TTL; or Redis, shared by replicas).
- :mod:`.store`: :class:`~.store.ResponseStore`, which rebuilds a chained request's
  conversation before the pipeline and keeps each answer delivered to the client.
- :mod:`.endpoints`: ``GET``/``DELETE /v1/responses/{id}`` and ``.../input_items``.

API: https://platform.openai.com/docs/api-reference/responses
"""
