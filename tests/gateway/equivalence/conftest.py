"""The harness's servers, started once for the package: the two recording fakes, and a
gateway per policy in front of them (each test reads and clears the recorders as it goes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.compression.tokens import o200k
from gateway.testing.fake_upstream import FakeUpstream
from tests.gateway.equivalence import harness
from tests.gateway.equivalence.harness import Gateway


@pytest.fixture(scope="package")
def recorders() -> Iterator[dict[str, tuple[FakeUpstream, str]]]:
    # o200k_base, which the checks count moved lines in, loaded here on the test's thread
    # (see harness.start_gateway)
    o200k()
    started = harness.start_recorders()
    yield {api: (fake, server.url) for api, (fake, server) in started.items()}
    for _, server in started.values():
        server.stop()


@pytest.fixture(scope="package")
def default_gateway(recorders: dict[str, tuple[FakeUpstream, str]],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = harness.start_gateway(tmp_path_factory.mktemp("default"), harness.DEFAULT, recorders,
                               every=False)
    yield gw
    gw.server.stop()


@pytest.fixture(scope="package")
def every_stage_gateway(recorders: dict[str, tuple[FakeUpstream, str]],
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("every-stage")
    gw = harness.start_gateway(tmp, harness.every_stage(harness.artifact(tmp)), recorders,
                               every=True)
    yield gw
    gw.server.stop()


@pytest.fixture(params=["default", "every-stage"])
def gateway(request: pytest.FixtureRequest) -> Gateway:
    """Each policy's gateway in turn."""
    name = "default_gateway" if request.param == "default" else "every_stage_gateway"
    gw: Gateway = request.getfixturevalue(name)
    return gw
