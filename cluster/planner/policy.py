"""From the replicas a pool needs to the replicas it gets: bounds, a bounded step, no flapping.

Up at once (a missed target costs users now), by at most ``max_step`` replicas per interval;
down only after ``scale_down_intervals`` intervals in a row that all wanted fewer, then by at
most ``max_step`` and never below the largest of those wants. Always within
``[min_replicas, max_replicas]``.
"""

from dataclasses import dataclass, field


@dataclass
class PoolPolicy:
    min_replicas: int
    max_replicas: int
    max_step: int = 1
    scale_down_intervals: int = 2
    _wants_below: list[int] = field(default_factory=list)  # the recent wants under current

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, "
                f"{self.max_replicas}"
            )
        if self.max_step < 1 or self.scale_down_intervals < 1:
            raise ValueError("max_step and scale_down_intervals must be >= 1")

    def next(self, current: int, wanted: int) -> tuple[int, str]:
        """The count to apply after ``current`` when ``wanted`` are needed, and why."""
        want = min(self.max_replicas, max(self.min_replicas, wanted))
        bounded = "" if want == wanted else f" (bounded from {wanted})"
        if want > current:
            self._wants_below.clear()
            new = min(want, current + self.max_step)
            return new, f"up: {want} wanted{bounded}" + (
                f", step {self.max_step}" if new < want else ""
            )
        if want == current:
            self._wants_below.clear()
            return current, f"hold: {want} wanted{bounded}"
        self._wants_below.append(want)
        if len(self._wants_below) < self.scale_down_intervals:
            seen = len(self._wants_below)
            return (
                current,
                f"hold: {want} wanted{bounded}, {seen} of {self.scale_down_intervals} intervals",
            )
        target = max(self._wants_below[-self.scale_down_intervals :])
        self._wants_below.clear()
        new = max(target, current - self.max_step)
        return new, f"down: {target} wanted for {self.scale_down_intervals} intervals{bounded}"
