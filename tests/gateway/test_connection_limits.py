"""The connection cap's default: half the open-file soft limit, at most 16384; an explicit
cap that leaves upstreams less than half is warned about."""

from __future__ import annotations

from gateway.config import ServerConfig
from gateway.connection_limits import MAX_AUTO_CONNECTIONS, ConnectionLimits


def test_the_default_cap_leaves_half_the_descriptors_to_upstreams_and_files():
    assert ConnectionLimits.of(ServerConfig(), soft_limit=256).max_connections == 128
    assert ConnectionLimits.of(ServerConfig(), soft_limit=1 << 20).max_connections \
        == MAX_AUTO_CONNECTIONS
    assert ConnectionLimits.of(ServerConfig(), soft_limit=-1).max_connections \
        == MAX_AUTO_CONNECTIONS  # unlimited
    assert ConnectionLimits.of(ServerConfig(max_connections=50), soft_limit=256) \
        .max_connections == 50


def test_a_cap_past_half_the_descriptors_is_warned_about():
    assert ConnectionLimits(max_connections=128).descriptor_warning(256) is None
    warning = ConnectionLimits(max_connections=200).descriptor_warning(256)
    assert warning is not None and "56 of the 256" in warning
