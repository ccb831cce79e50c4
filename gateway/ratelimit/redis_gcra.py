"""GCRA in Redis: every bucket of a request decided in one round trip, shared by replicas.

The arithmetic of :func:`gateway.ratelimit.gcra.decide`, as one Lua script run with
EVALSHA (redis-py's ``register_script``; loaded again by itself after a Redis restart).
Atomic: no other command runs between the reads and the writes, so replicas racing for a
key's last request never both get it. The clock is Redis's (``TIME``), so replicas' clocks
do not matter. Each bucket is one string key, ``{prefix}{<key id>}:...``, holding its TAT
(µs) and expiring when the bucket is full again; the braces are a hash tag: all of a key's
buckets sit in one Redis Cluster slot, which a multi-key script needs.

No library fits: ``limits`` (the well-kept one) has fixed, moving and sliding windows with
a cost per call, one limit per call: not a request's buckets charged all or none in one
round trip, nor a reservation settled afterwards; redis-cell is a Redis module, which
managed Redis services do not load. Connection errors and timeouts raise (``redis.exceptions.RedisError``, ``OSError``);
:class:`~gateway.ratelimit.limiter.RateLimiter` bounds each call and falls back.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.ratelimit.gcra import Bucket, Verdict

__all__ = ["SCRIPT", "RedisGCRA"]

#: KEYS[i]: bucket i's TAT (µs, Redis time). ARGV[1]: "check" (charge every bucket, or none
#: when one has no room) or "settle" (add each cost, which may be negative, unchecked); then
#: per bucket: interval (µs per unit), tolerance (µs: one period), cost (units).
#: Returns {allowed, then per bucket: remaining, reset (µs), wait (µs)}.
SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local settle = ARGV[1] == 'settle'
local n = #KEYS
local start, new, wait = {}, {}, {}
local allowed = 1
for i = 1, n do
  local interval = tonumber(ARGV[3 * i - 1])
  local tolerance = tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  start[i] = tat
  new[i] = tat + tonumber(ARGV[3 * i + 1]) * interval
  wait[i] = 0
  if settle then
    if new[i] < now then new[i] = now end
  elseif new[i] - tolerance - now > 0.5 then
    wait[i] = new[i] - tolerance - now
    allowed = 0
  end
end
local out = {allowed}
for i = 1, n do
  local interval = tonumber(ARGV[3 * i - 1])
  local tolerance = tonumber(ARGV[3 * i])
  local tat = start[i]
  if allowed == 1 then
    tat = new[i]
    local ttl = math.ceil((tat - now) / 1000)
    if ttl > 0 then
      redis.call('SET', KEYS[i], string.format('%.17g', tat), 'PX', ttl)
    else
      redis.call('DEL', KEYS[i])
    end
  end
  local remaining = math.floor((tolerance - (tat - now)) / interval + 1e-9)
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = remaining
  out[#out + 1] = math.ceil(tat - now)
  out[#out + 1] = math.ceil(wait[i])
end
return out
"""


class RedisGCRA:
    """The buckets in the Redis at ``url``, under ``prefix``. redis-py reconnects by itself
    on the next call after a failure; it does not retry (the caller's bound is a few ms)."""

    def __init__(self, url: str, prefix: str = "gwrl:", socket_timeout_s: float = 1.0) -> None:
        self.prefix = prefix
        self.client = Redis.from_url(url, socket_timeout=socket_timeout_s,
                                     socket_connect_timeout=socket_timeout_s,
                                     retry=Retry(NoBackoff(), 0), retry_on_timeout=False)
        self._script = self.client.register_script(SCRIPT)

    async def decide(self, buckets: Sequence[Bucket], settle: bool = False) -> Verdict:
        """Charge ``buckets`` all or nothing (``settle``: add their costs unchecked)."""
        args: list[str | float | int] = ["settle" if settle else "check"]
        for b in buckets:
            args += (b.interval_us, b.tolerance_us, b.cost)
        out = await self._script(keys=[self.prefix + b.key for b in buckets], args=args)
        allowed = bool(out[0])
        n = len(buckets)
        return Verdict(allowed,
                       tuple(int(out[1 + 3 * i]) for i in range(n)),
                       tuple(int(out[2 + 3 * i]) / 1e6 for i in range(n)),
                       tuple(int(out[3 + 3 * i]) / 1e6 for i in range(n)),
                       "redis")

    async def aclose(self) -> None:
        await self.client.aclose()
