"""Ids the gateway makes for what it answers (``chatcmpl-``, ``msg_``, ``resp_``, ``fc_``,
``toolu_`` ... followed by 32 hex digits).

128 random bits, as ``uuid.uuid4().hex`` gives (the same length, without the version
digits): a response id is also a handle a client fetches or continues from
(``/v1/responses/{id}``), so it must not be guessable, unlike the request ids of
:class:`gateway.requestlog.RequestIds`. ``os.urandom(16).hex()`` costs about a quarter of
``uuid4().hex``, which builds a ``UUID`` object in Python around the same 16 bytes.
"""

from __future__ import annotations

import os

__all__ = ["random_hex"]


def random_hex() -> str:
    """32 random hex digits (128 bits from the OS's random source)."""
    return os.urandom(16).hex()
