"""A router replica's bound on requests in flight, per model: past it, a request is refused at
once.

Each model's ``max_concurrent_requests`` (``serving/config.py``) caps the API requests of that
model this router replica holds at a time, streams included (each replica counts its own); one
more gets 429 (HTTP, with ``Retry-After``) or RESOURCE_EXHAUSTED (gRPC) instead of waiting, so
overload never builds a queue here. Both transports take their slots from the same
``Admission``. A slot is taken by ``start_group`` and given back when the request group closes,
which every path does: completion, a refusal, a failure, a disconnected client, a cancelled
stream.
"""

import threading
from collections.abc import Iterable, Mapping

from pdserve.router.api.errors import too_many_requests
from pdserve.serving.config import DEFAULT_MAX_CONCURRENT_REQUESTS


class Slot:
    """One admitted request's place; ``release`` gives it back (once, however often called)."""

    def __init__(self, limit: "InFlightLimit") -> None:
        self._limit = limit
        self._held = True

    def release(self) -> None:
        with self._limit.lock:
            if self._held:
                self._held = False
                self._limit.in_flight -= 1


class InFlightLimit:
    """One model's count of requests in flight, and its cap."""

    def __init__(self, model: str, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the limit on requests in flight must be >= 1, got {limit}")
        self.model = model
        self.limit = limit
        self.in_flight = 0
        # The HTTP app and the gRPC servicer may run on event loops of their own threads.
        self.lock = threading.Lock()

    def can_acquire(self) -> bool:
        return self.in_flight < self.limit

    def acquire(self) -> Slot:
        """A slot for one more request; raises the 429 ``APIError`` when the model is full."""
        with self.lock:
            if not self.can_acquire():
                raise too_many_requests(self.model, self.limit)
            self.in_flight += 1
        return Slot(self)


class Admission:
    """Every served model's ``InFlightLimit``, shared by the HTTP app and the gRPC servicer."""

    def __init__(self, limits: Mapping[str, int]) -> None:
        self._limits = {model: InFlightLimit(model, limit) for model, limit in limits.items()}

    @classmethod
    def with_default_limits(cls, models: Iterable[str]) -> "Admission":
        """Every model at the config's default ``max_concurrent_requests``."""
        return cls(dict.fromkeys(models, DEFAULT_MAX_CONCURRENT_REQUESTS))

    def __getitem__(self, model: str) -> InFlightLimit:
        return self._limits[model]

    def limits(self) -> dict[str, int]:
        """Per model, its bound."""
        return {model: limit.limit for model, limit in self._limits.items()}

    def in_flight(self) -> dict[str, int]:
        """Per model, its requests in flight now."""
        return {model: limit.in_flight for model, limit in self._limits.items()}
