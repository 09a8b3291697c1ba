"""The proxies' ports, checked before a local cluster starts: a port something else holds is one
line at once, not Ray's traceback from the proxy after the cluster came up."""

import socket

ANY_HOST = "0.0.0.0"
LOOPBACK = "127.0.0.1"
# Serve's gRPC proxy listens on every interface, whatever the HTTP host.
GRPC_HOST = ANY_HOST


class PortInUseError(OSError):
    """A port ``pdserve serve`` would listen on is taken; the message is one line."""


def in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails now. SO_REUSEADDR, as the servers set it: a port left
    in TIME_WAIT by a server that stopped is free to them, a listening one is not."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def check_free(http_host: str, http_port: int, grpc_port: int) -> None:
    """Raises ``PortInUseError`` naming each of the HTTP and gRPC ports that is taken."""
    taken = [
        f"{what} port {port} ({flag})"
        for what, host, port, flag in (
            ("HTTP", http_host, http_port, "--port"),
            ("gRPC", GRPC_HOST, grpc_port, "--grpc-port"),
        )
        if in_use(host, port)
    ]
    if taken:
        raise PortInUseError(
            f"already in use: {', '.join(taken)}; stop what holds it or pick another"
        )
