"""The test hosts are machines apart: own address, hostname and processes, reached over SSH, no
route out; a Ray cluster spans two of them and `ray stop` on each ends only its own; a killed host
leaves no process behind; a host's wall clock runs at the offset it was started with."""

import json
import secrets
import shlex
import socket
import sys
import time
from pathlib import Path

import pytest

from pdserve.tests.multihost.hosts import (
    DEAD_END_GATEWAY,
    FAKETIME_LIB,
    PREFIX_LEN,
    SSH_PORT,
    Host,
)

# Every test here runs in `make test`'s Ray half, before the session's cluster starts: the hosts
# are one set per machine, so their tests share one process, and a Ray cluster on them would take
# the cores the session cluster's tests count on.
pytestmark = [pytest.mark.multihost, pytest.mark.slow, pytest.mark.own_ray_cluster]

RAY = Path(sys.executable).with_name("ray")  # this checkout's environment: hosts share the disk
GCS_PORT = 6379
OBJECT_STORE_BYTES = 100 * 2**20  # per node; Ray's default (30% of memory) would not fit twice
OUTSIDE = "1.1.1.1"  # any address off the bridge
OUTSIDE_TIMEOUT_S = 10
LOOKING = "hostname; ip -4 -o addr show scope global | awk '{print $4}'; ps -e -o comm="
RAY_DAEMONS = {"raylet", "gcs_server"}
RAY_START_LOG = "/tmp/ray-start.log"  # the host's own /tmp
CLOCK_OFFSET_S = 3600
CLOCK_TOLERANCE_S = 30  # an SSH round trip on a busy machine
# A task pinned to each node says where it ran.
DRIVER = """
import json, socket, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init(address="auto", logging_level="ERROR")
nodes = [node for node in ray.nodes() if node["Alive"]]

@ray.remote(num_cpus=1)
def where():
    return socket.gethostname(), ray.util.get_node_ip_address()

ran = [where.options(scheduling_strategy=On(n["NodeID"], soft=False)).remote() for n in nodes]
print(json.dumps({
    "addresses": sorted(node["NodeManagerAddress"] for node in nodes),
    "ran_on": sorted(ray.get(ran)),
}))
"""


def ssh_from(host: Host, to: Host, command: str) -> str:
    """``command``'s output on ``to``, reached over SSH from ``host``."""
    return host.ssh(shlex.join(host.identity.argv(to.address, command))).stdout


def ray_start(host: Host, env: str, args: str) -> None:
    """`ray start args` on ``host``, its output in a file: the daemons it leaves behind must not
    hold SSH's pipes open."""
    log = RAY_START_LOG
    host.ssh(f"{env} {RAY} start {args} >{log} 2>&1 || {{ cat {log} >&2; exit 1; }}")


@pytest.mark.timeout(120)
def test_each_host_is_a_machine_of_its_own(hosts: list[Host]) -> None:
    for host in hosts:
        name, address, *commands = host.ssh(LOOKING).stdout.split()
        assert (name, address) == (host.name, f"{host.address}/{PREFIX_LEN}")
        # Its init, its sshd (listener and this session) and this command: nothing of the others.
        assert set(commands) <= {"python", "sshd", "bash", "ps"}, commands
        route = host.ssh(f"ip route get {OUTSIDE}").stdout
        assert f"via {DEAD_END_GATEWAY} dev eth0" in route
        for other in hosts:
            assert ssh_from(host, other, "hostname").strip() == other.name
    outside = hosts[0].ssh(
        f"timeout {OUTSIDE_TIMEOUT_S} bash -c '</dev/tcp/{OUTSIDE}/53'", check=False
    )
    assert outside.returncode != 0 and "No route to host" in outside.stderr, outside


@pytest.mark.timeout(300)
def test_a_ray_cluster_spans_two_hosts(hosts: list[Host]) -> None:
    head, worker = hosts[:2]
    # Token auth (Ray's default) with one token the test hands every node, as an operator would.
    env = f"PYTHONSAFEPATH=1 RAY_AUTH_MODE=token RAY_AUTH_TOKEN={secrets.token_hex(32)}"
    node = f"--num-cpus=1 --object-store-memory={OBJECT_STORE_BYTES} --disable-usage-stats"
    try:
        ray_start(head, env, f"--head --port={GCS_PORT} --include-dashboard=false {node}")
        ray_start(worker, env, f"--address={head.address}:{GCS_PORT} {node}")
        driver = head.ssh(f"cd /tmp && {env} {sys.executable} -c {shlex.quote(DRIVER)}")
        seen = json.loads(driver.stdout.splitlines()[-1])
        assert seen["addresses"] == [head.address, worker.address]
        assert seen["ran_on"] == [[head.name, head.address], [worker.name, worker.address]]
    finally:
        for host in (worker, head):
            host.ssh(f"{RAY} stop", check=False)
    for host in (head, worker):
        assert not RAY_DAEMONS & set(host.processes().values()), host.processes()


@pytest.mark.timeout(120)
def test_a_killed_host_leaves_no_process(hosts: list[Host]) -> None:
    victim, bystanders = hosts[1], [hosts[0], hosts[2]]
    victim.ssh("setsid sleep 600 </dev/null >/dev/null 2>&1 &")
    assert "sleep" in victim.processes().values()
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
@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="no libfaketime: apt-get install faketime")
def test_a_host_clock_runs_at_its_offset(hosts: list[Host]) -> None:
    host = hosts[2]
    host.kill()
    try:
        host.start(clock_offset_s=CLOCK_OFFSET_S)
        # date, Python and the monotonic clock: the wall clock shifts, the monotonic one does not
        wall = float(host.ssh("date +%s.%N").stdout)
        clocks = "import time; print(time.time(), time.monotonic())"
        python = host.ssh(f"{sys.executable} -c {shlex.quote(clocks)}")
        python_wall, monotonic = map(float, python.stdout.split())
        assert abs(wall - time.time() - CLOCK_OFFSET_S) < CLOCK_TOLERANCE_S
        assert abs(python_wall - time.time() - CLOCK_OFFSET_S) < CLOCK_TOLERANCE_S
        assert abs(monotonic - time.monotonic()) < CLOCK_TOLERANCE_S
    finally:
        host.kill()
        host.start()
    assert abs(float(host.ssh("date +%s.%N").stdout) - time.time()) < CLOCK_TOLERANCE_S
