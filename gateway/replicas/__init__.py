"""Replica pools: one upstream served by several replicas of an engine, each request routed
to one of them (:mod:`gateway.replicas.routing`) by what their prefix caches hold
(:mod:`gateway.replicas.prefix`) and their load."""
