"""Coalescing (single-flight): identical requests in flight at once share one upstream call.

- :mod:`.policy`: the policy's ``[coalesce]`` section.
- :mod:`.flight`: the table of calls in flight and each call's fan-out to its clients, whole
  answers and streams alike (:class:`~.flight.Flights`).

The stage that uses them is :mod:`gateway.stages.coalesce`. Technique: Go's
``golang.org/x/sync/singleflight``, with the stream shared from its first byte as it arrives.
"""
