"""The policy's ``[coalesce]`` section: when identical requests share one upstream call.

::

    [coalesce]
    enabled = true
    mode = "deterministic"   # or "always"

``deterministic`` (the default) shares only requests whose answer the client asked to be
the same every time: ``temperature = 0``, or a ``seed``. Two such requests, alike byte for
byte in what they ask (the same gateway key and namespace, model, API, messages and every
parameter, ``stream`` included), would get the same answer from the upstream, so one answer
given to both changes nothing they asked for. ``always`` shares any identical requests, as a
sampled answer is one the client could have got (a burst of one question at temperature 1
then gets one sample instead of several).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CoalescePolicy"]


@dataclass(frozen=True)
class CoalescePolicy:
    enabled: bool = True
    mode: Literal["deterministic", "always"] = "deterministic"
