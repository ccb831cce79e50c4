"""Rate limits per gateway key (and per key and model): requests and tokens per minute,
held jointly by every replica through Redis, with an in-process fallback (see
:mod:`gateway.stages.rate_limit`)."""
