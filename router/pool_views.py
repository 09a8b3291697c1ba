"""What this process's request routers know of the worker pools, for the ingress to ask.

A KV-aware router (``kv_routing.py``) registers itself here under its pool when Serve builds it.
The registry is its own module because Serve pickles a request router's module by value: state
kept there would be a copy per router, not the one the ingress reads.
"""

from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from pdserve.serving.messages import GenerateRequest

Role = Literal["prefill", "decode"]


class PoolView(Protocol):
    """One pool's replicas, as their reported stats (and the requests sent since) describe them."""

    @property
    def num_replicas(self) -> int: ...

    def cached_prefix_tokens(self, request: "GenerateRequest") -> int:
        """The prompt's prefix cached at the replica this request would be routed to."""
        ...

    def saturated(self, max_load_tokens: int) -> bool:
        """Whether every replica has at least ``max_load_tokens`` tokens of load."""
        ...

    def request_done(self, request_id: str) -> None:
        """The call for ``request_id`` to this pool has ended (returned, failed or cancelled)."""
        ...


_views: dict[tuple[str, Role], PoolView] = {}


def register(model: str, role: Role, view: PoolView) -> None:
    _views[model, role] = view


def pool_view(model: str, role: Role) -> PoolView | None:
    """The view of a pool this process calls; None before its first call, or when the pool is
    routed by Serve's default router."""
    return _views.get((model, role))
