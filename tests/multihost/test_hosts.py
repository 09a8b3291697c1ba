"""The test hosts are machines apart: own address, hostname and processes, reached over SSH, no
route out; a killed host leaves no process behind; a host's wall clock runs at the offset it was
started with. (A Ray cluster across them: test_ray_up.py.)"""

import shlex
import socket
import sys
import time

import pytest

from pdserve.tests.multihost.hosts import (
    CLOCK_OFFSET_S,
    DEAD_END_GATEWAY,
    FAKETIME_LIB,
    PREFIX_LEN,
    SKEWED_HOST,
    SSH_PORT,
    Host,
)

# In `make test`'s first stream, before the tests without Ray, beside the session's cluster in the
# other: the hosts' clusters never meet it (own network, /tmp, processes).
pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.own_ray_cluster]

OUTSIDE = "1.1.1.1"  # any address off the bridge
OUTSIDE_TIMEOUT_S = 10
LOOKING = "hostname; ip -4 -o addr show scope global | awk '{print $4}'; ps -e -o comm="
CLOCK_TOLERANCE_S = 30  # an SSH round trip on a busy machine
STARTED_WAIT_S = 10
POLL_S = 0.05


def ssh_from(host: Host, to: Host, command: str) -> str:
    """``command``'s output on ``to``, reached over SSH from ``host``."""
    return host.ssh(shlex.join(host.identity.argv(to.address, command))).stdout


@pytest.mark.timeout(120)
def test_each_host_is_a_machine_of_its_own(hosts: list[Host]) -> None:
    for host, following in zip(hosts, hosts[1:] + hosts[:1], strict=True):
        name, address, *commands = host.ssh(LOOKING).stdout.split()
        assert (name, address) == (host.name, f"{host.address}/{PREFIX_LEN}")
        # Its init, its sshd (listener and this session) and this command: nothing of the others.
        assert set(commands) <= {"python", "sshd", "bash", "ps"}, commands
        route = host.ssh(f"ip route get {OUTSIDE}").stdout
        assert f"via {DEAD_END_GATEWAY} dev eth0" in route
        # Around the ring: each host reaches the next over SSH, the last the first.
        assert ssh_from(host, following, "hostname").strip() == following.name
    outside = hosts[0].ssh(
        f"timeout {OUTSIDE_TIMEOUT_S} bash -c '</dev/tcp/{OUTSIDE}/53'", check=False
    )
    assert outside.returncode != 0 and "No route to host" in outside.stderr, outside


@pytest.mark.timeout(120)
def test_a_killed_host_leaves_no_process(hosts: list[Host]) -> None:
    victim, bystanders = hosts[1], [hosts[0], hosts[2]]
    victim.ssh("setsid sleep 600 </dev/null >/dev/null 2>&1 &")
    # The ssh session ends as soon as setsid forks; its child execs sleep a moment later.
    deadline = time.monotonic() + STARTED_WAIT_S
    while "sleep" not in victim.processes().values():
        assert time.monotonic() < deadline, victim.processes()
        time.sleep(POLL_S)
    victim.kill()
    try:
        assert victim.processes() == {}
        with pytest.raises(OSError):  # the link is cut: silence, as from a machine turned off
            socket.create_connection((victim.address, SSH_PORT), timeout=1).close()
        for host in bystanders:
            assert "sshd" in host.processes().values()
    finally:
        victim.start()
    assert victim.ssh("hostname").stdout.strip() == victim.name


@pytest.mark.timeout(120)
@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason=f"no {FAKETIME_LIB}")
def test_a_host_clock_runs_at_its_offset(hosts: list[Host]) -> None:
    # date, Python and the monotonic clock: the wall clock shifts by the host's offset, the
    # monotonic one by its boot, and Python's timed waits still end on time (Debian's libfaketime
    # broke time.sleep or Event.wait)
    clocks = (
        "import threading, time; time.sleep(0.1); threading.Event().wait(0.1); "
        "print(time.time(), time.monotonic())"
    )
    for host in hosts:
        offset = CLOCK_OFFSET_S if host.index == SKEWED_HOST else 0
        wall = float(host.ssh("date +%s.%N").stdout)
        python = host.ssh(f"{sys.executable} -c {shlex.quote(clocks)}")
        python_wall, monotonic = map(float, python.stdout.split())
        assert abs(wall - time.time() - offset) < CLOCK_TOLERANCE_S, host.name
        assert abs(python_wall - time.time() - offset) < CLOCK_TOLERANCE_S, host.name
        assert abs(monotonic - time.monotonic() - host.booted_s_before) < CLOCK_TOLERANCE_S, (
            host.name
        )
