"""The session's test hosts (tests/multihost/hosts.py), made on first use; the tests skip, naming
the reason, where this machine cannot make them."""

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from pdserve.tests.multihost.hosts import Host, HostsUnavailable, bring_up

# A head and three workers: deploy/cluster-local.yaml's two (a prefill host, a decode host) and a
# second decode host, whose loss the first decode host's replica takes over.
HOST_COUNT = 4


@pytest.fixture(scope="session")
def hosts() -> Iterator[list[Host]]:
    """``host1`` to ``host4``, up. A test that kills one starts it again before it ends."""
    with ExitStack() as stack:
        try:
            up = stack.enter_context(bring_up(HOST_COUNT))
        except HostsUnavailable as why:
            pytest.skip(f"no test hosts: {why}")
        yield up
