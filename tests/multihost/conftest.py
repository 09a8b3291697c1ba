"""The session's test hosts (tests/multihost/hosts.py), made on first use; the tests skip, naming
the reason, where this machine cannot make them."""

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from pdserve.tests.multihost.hosts import (
    CLOCK_OFFSET_S,
    HOST_COUNT,
    SKEWED_HOST,
    Host,
    HostsUnavailable,
    bring_up,
)


@pytest.fixture(scope="session")
def hosts() -> Iterator[list[Host]]:
    """``host1`` to ``host4``, up, ``SKEWED_HOST``'s clock off by ``CLOCK_OFFSET_S``. A test that
    kills one starts it again before it ends."""
    with ExitStack() as stack:
        try:
            up = stack.enter_context(bring_up(HOST_COUNT, {SKEWED_HOST: CLOCK_OFFSET_S}))
        except HostsUnavailable as why:
            pytest.skip(f"no test hosts: {why}")
        yield up
