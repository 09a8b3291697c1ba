"""Test hosts: N machines made on this one out of Linux namespaces, each with its own ``sshd``.

A host is a network namespace (``ip netns``, named ``pdserve-hostN``) with one veth into a private
bridge, at ``10.77.0.(10+N)``, plus a PID, mount and UTS namespace of its own whose init reaps
orphans. So, over SSH, a host looks like a machine to Ray and ``ray up``: its own hostname, its
own processes only (``ray stop`` kills Ray's processes by name among those it sees), its own
``/tmp`` (``/tmp/ray``), ``/dev/shm`` (the object store) and home (an overlay on this machine's
``/root``: it sees what is there, its writes stay its own), and ``/etc/hosts`` naming every host.
The rest of the filesystem is shared: hosts run this checkout's ``.venv`` in place (a checkout
under ``/tmp`` is bound into each host's own ``/tmp`` at its path).

Nothing leaves the bridge. Each host's default route points at an address on the bridge that no
one holds: programs that find their address from the default route (``ray start``) find the
host's, and a packet for anywhere else goes nowhere (``No route to host``).

``Host.kill`` cuts the host's link, then kills its init, which kills every process of the host:
peers see silence, as from a machine that lost power, not closed connections.

Each host's monotonic clock counts from a boot of its own, as a machine's does: a time namespace
puts host N's boot N days before this machine's, so no two hosts' monotonic clocks agree. A wall
clock offset is libfaketime preloaded into every SSH session of a host, so every process started
over SSH reads the wall clock shifted. Time namespaces cannot do that: they shift CLOCK_MONOTONIC
and CLOCK_BOOTTIME only, never CLOCK_REALTIME. The library is the build the ``libfaketime`` wheel
carries: Debian's 0.9.10 fails Python 3.11's ``time.sleep`` with EINVAL when the monotonic clock
is left alone (wolfcw/libfaketime#426), and hangs ``threading.Event.wait`` when it is not.
"""

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import libfaketime

CHECKOUT = Path(__file__).resolve().parents[2]
# The session's hosts (conftest.py): a head and three workers, deploy/cluster-local.yaml's two (a
# prefill host, a decode host) and a second decode host, whose loss the first one's replica takes
# over. The first decode host's wall clock runs an hour behind the others' (the monotonic clocks
# of all of them differ already: BOOTS_APART_S).
HOST_COUNT = 4
SKEWED_HOST, CLOCK_OFFSET_S = 3, -3600
SUBNET = "10.77.0"
PREFIX_LEN = 24
MACHINE_ADDRESS = f"{SUBNET}.1"  # this machine's address on the bridge
DEAD_END_GATEWAY = f"{SUBNET}.254"  # held by no one: the hosts' default route ends there
FIRST_HOST_OCTET = 10  # host N is at SUBNET.(10+N)
BOOTS_APART_S = 86_400  # host N booted N days before this machine
BRIDGE = "pdserve-br0"
SSH_PORT = 22
SSHD = Path("/usr/sbin/sshd")
FAKETIME_LIB = Path(libfaketime.__file__).parent / "vendor/libfaketime/src/libfaketime.so.1"
TOOLS = ("ip", "unshare", "nsenter", "setpriv", "ssh", "ssh-keygen")
# One set of hosts on a machine at a time: their names and addresses are fixed.
LOCK = Path("/run/pdserve-test-hosts.lock")
# Not /tmp, which every host replaces with its own: the keys and configs must be seen from hosts.
STATE_PARENT = Path("/var/tmp")
STATE_PREFIX = "pdserve-hosts-"
BOOT_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 10.0
SSH_TIMEOUT_S = 60.0
SSH_CONNECT_TIMEOUT_S = 10  # whole seconds, as ssh takes it
POLL_S = 0.05
# The hosts' init: PID 1 of a namespace must reap the orphans (every `ray start` daemon) or they
# linger as zombies.
REAPER = "import os, time\nwhile True:\n try: os.wait()\n except ChildProcessError: time.sleep(1)"


class HostsUnavailable(RuntimeError):
    """Test hosts cannot be made on this machine; the message says why (tests skip with it)."""


@dataclass(frozen=True)
class SshIdentity:
    """The one client key every host authorises, and the hosts' keys as known hosts."""

    key: Path
    known_hosts: Path

    def argv(self, address: str, command: str) -> list[str]:
        options = (
            "BatchMode=yes",
            "LogLevel=ERROR",
            f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
            f"UserKnownHostsFile={self.known_hosts}",
        )
        flags = [f"-o{option}" for option in options]
        return ["ssh", "-i", str(self.key), *flags, f"root@{address}", command]


class Host:
    """One test host: its network (made by ``bring_up``) and the namespaces ``start`` makes."""

    def __init__(self, index: int, state: Path, identity: SshIdentity) -> None:
        self.index = index
        self.name = f"host{index}"
        self.address = f"{SUBNET}.{FIRST_HOST_OCTET + index}"
        self.netns = f"pdserve-{self.name}"
        self.veth = f"pdserve-veth{index}"  # the bridge's end; the host's end is its eth0
        self.booted_s_before = index * BOOTS_APART_S  # its monotonic clock ahead of this machine's
        self.dir = state / self.name
        self.identity = identity
        self._unshare: subprocess.Popen[bytes] | None = None
        self._pid_ns = ""  # the PID namespace's /proc/PID/ns/pid link, seen from the machine

    def start(self, clock_offset_s: int = 0) -> None:
        """Boots the host: its init and sshd in fresh namespaces; returns once sshd accepts."""
        _run("ip", "link", "set", self.veth, "up")
        (self.dir / "sshd_config").write_text(self._sshd_config(clock_offset_s))
        kept = []  # bound into the host's /tmp first, carried over it with --rbind
        for path in _kept_from_tmp():
            inside = self.dir / "tmp" / path.relative_to("/tmp")
            inside.mkdir(parents=True, exist_ok=True)
            kept.append(f"mount --bind {path} {inside}")
        boot = [
            f"mount -t overlay overlay -o lowerdir=/root,upperdir={self.dir}/home,"
            f"workdir={self.dir}/home-work /root",
            *kept,
            f"mount --rbind {self.dir}/tmp /tmp",
            "mount -t tmpfs tmpfs /dev/shm",
            f"mount --bind {self.dir.parent}/hosts /etc/hosts",
            f"hostname {self.name}",
            "mkdir -p /run/sshd",  # sshd's privilege-separation directory
            f"{SSHD} -f {self.dir}/sshd_config -E {self.dir}/sshd.log",
            f"exec {sys.executable} -c '{REAPER}'",
        ]
        # A dying test run takes its hosts along: unshare dies with it (pdeathsig) and kills the
        # init (--kill-child), whose death kills every other process of the host.
        with open(self.dir / "init.log", "wb") as log:
            self._unshare = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net=/run/netns/{self.netns}",
                 "unshare", "--pid", "--kill-child", "--mount-proc", "--mount", "--uts", "--ipc",
                 "--time", f"--monotonic={self.booted_s_before}",
                 f"--boottime={self.booted_s_before}", "sh", "-c", " && ".join(boot)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._await_sshd()

    def kill(self) -> None:
        """Kills every process of the host, its link cut first; ``start`` boots it again."""
        if self._unshare is None:
            return
        _run("ip", "link", "set", self.veth, "down")
        self._unshare.send_signal(signal.SIGKILL)
        self._unshare.wait()
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while self.processes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes outlived its init: {self.processes()}")
            time.sleep(POLL_S)

    def processes(self) -> dict[int, str]:
        """The host's live processes as this machine sees them: pid -> command name. A zombie
        counts as gone: it holds nothing, and the init of a killed host waits as one for this
        machine's init to reap it."""
        found: dict[int, str] = {}
        if not self._pid_ns:
            return found
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and os.readlink(entry / "ns/pid") == self._pid_ns:
                    # "pid (name) state ...", where the name may hold spaces and parentheses
                    head, _, tail = (entry / "stat").read_text().rpartition(")")
                    if tail.split()[0] != "Z":
                        found[int(entry.name)] = head.partition("(")[2]
            except OSError:  # the process ended while we looked
                continue
        return found

    def ssh(
        self, command: str, timeout_s: float = SSH_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs ``command`` on the host over SSH as root; raises on a non-zero exit if ``check``."""
        done = subprocess.run(
            self.identity.argv(self.address, command),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
        if check and done.returncode:
            raise RuntimeError(f"{self.name}: `{command}` exited {done.returncode}:\n{done.stderr}")
        return done

    def _sshd_config(self, clock_offset_s: int) -> str:
        lines = [
            f"ListenAddress {self.address}:{SSH_PORT}",
            f"HostKey {self.dir}/host_key",
            f"AuthorizedKeysFile {self.identity.key}.pub",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",  # the state lies under /var/tmp, world-writable
            "PidFile none",
        ]
        if clock_offset_s:
            if not FAKETIME_LIB.exists():
                raise HostsUnavailable(f"a clock offset needs libfaketime: no {FAKETIME_LIB}")
            lines.append(
                f"SetEnv LD_PRELOAD={FAKETIME_LIB} FAKETIME={clock_offset_s:+d} "
                # the raylet drops LD_PRELOAD from the workers it starts unless told not to
                "FAKETIME_DONT_FAKE_MONOTONIC=1 RAY_LD_PRELOAD_ON_WORKERS=1"
            )
        return "\n".join(lines) + "\n"

    def _await_sshd(self) -> None:
        assert self._unshare is not None
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            if self._unshare.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "init.log").read_text() + _tail(self.dir / "sshd.log")
                raise RuntimeError(f"{self.name} did not boot:\n{log}")
            try:
                socket.create_connection((self.address, SSH_PORT), timeout=POLL_S).close()
                break
            except OSError:
                time.sleep(POLL_S)
        init = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/children").read_text()
        self._pid_ns = os.readlink(f"/proc/{int(init.split()[0])}/ns/pid")


def check_prerequisites() -> None:
    """Raises HostsUnavailable unless this machine can make test hosts."""
    if os.geteuid() != 0:
        raise HostsUnavailable("test hosts need root (network and PID namespaces)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise HostsUnavailable(f"test hosts need {', '.join(missing)} (iproute2, util-linux)")
    if not SSHD.exists():
        raise HostsUnavailable(f"no {SSHD}: install Debian's openssh-server (make test-deps)")


@contextmanager
def bring_up(count: int, clock_offsets_s: Mapping[int, int] | None = None) -> Iterator[list[Host]]:
    """``count`` hosts, ``host1`` to ``hostN``, booted (host N's clock offset by
    ``clock_offsets_s[N]`` seconds); everything is torn down on exit, whatever happened."""
    check_prerequisites()
    with open(LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HostsUnavailable(f"another run holds the test hosts ({LOCK})") from None
        _remove_leftovers()  # of a run that died before its teardown
        state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX, dir=STATE_PARENT))
        key = state / "client_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        identity = SshIdentity(key, state / "known_hosts")
        hosts = [Host(index, state, identity) for index in range(1, count + 1)]
        try:
            _make_network(state, hosts)
            for host in hosts:
                host.start((clock_offsets_s or {}).get(host.index, 0))
            yield hosts
        finally:
            try:
                for host in hosts:
                    host.kill()
            finally:
                _remove_leftovers()


def _kept_from_tmp() -> list[Path]:
    """This checkout and its Python environment where they lie under /tmp, which every host
    replaces with its own: the hosts must run them all the same."""
    paths = {CHECKOUT, Path(sys.prefix).resolve()}
    under = [path for path in paths if path.is_relative_to("/tmp")]
    return sorted(p for p in under if not any(p != q and p.is_relative_to(q) for q in under))


def _make_network(state: Path, hosts: list[Host]) -> None:
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{MACHINE_ADDRESS}/{PREFIX_LEN}", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    names = ["127.0.0.1 localhost", *(f"{host.address} {host.name}" for host in hosts)]
    (state / "hosts").write_text("\n".join(names) + "\n")
    known = []
    for host in hosts:
        for sub in ("home", "home-work", "tmp"):
            (host.dir / sub).mkdir(parents=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host.dir / "host_key"))
        known.append(f"{host.address} {(host.dir / 'host_key.pub').read_text()}")
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "eth0", "netns", host.netns)
        _run("ip", "link", "set", host.veth, "master", BRIDGE)
        inside = ("ip", "-n", host.netns)
        _run(*inside, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", "eth0")
        _run(*inside, "link", "set", "eth0", "up")
        _run(*inside, "link", "set", "lo", "up")
        _run(*inside, "route", "add", "default", "via", DEAD_END_GATEWAY)
    (state / "known_hosts").write_text("".join(known))


def _remove_leftovers() -> None:
    """Removes every host namespace, veth, bridge and state folder of ours: called under LOCK."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in netns.splitlines() if line.startswith("pdserve-")):
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("pdserve-"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    for old in STATE_PARENT.glob(f"{STATE_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")


def _tail(path: Path) -> str:
    return path.read_text()[-2000:] if path.exists() else ""
