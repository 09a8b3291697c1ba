"""A replica's measured performance, as ``pdserve profile`` writes it and the planner reads it.

- prefill: seconds to prefill one prompt of ``tokens`` tokens on an idle replica;
- decode: seconds of one decode step with ``batch`` running requests of ``context`` tokens each.

Between measured points the times are interpolated linearly (decode: bilinearly over the grid),
and beyond the ends extrapolated from the last two points, so a planner asked about a longer
prompt or a larger batch than profiled still gets a rising, not a flat, answer.
"""

import bisect
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PrefillPoint:
    tokens: int
    seconds: float


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context: int
    seconds: float


@dataclass(frozen=True)
class Profile:
    model: str
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]  # a full grid: every batch at every context
    meta: dict = field(default_factory=dict)  # CPU, threads, dtype: how it was measured

    def __post_init__(self) -> None:
        if len(self.prefill) < 2:
            raise ValueError("a profile needs at least two prefill points")
        batches, contexts = self.batches, self.contexts
        if len(batches) < 2 or len(contexts) < 1:
            raise ValueError("a profile needs decode points at two batch sizes or more")
        if len(self.decode) != len(batches) * len(contexts):
            raise ValueError("the decode points must form a full batch x context grid")

    @property
    def batches(self) -> list[int]:
        return sorted({p.batch for p in self.decode})

    @property
    def contexts(self) -> list[int]:
        return sorted({p.context for p in self.decode})

    def prefill_seconds(self, tokens: float) -> float:
        points = sorted(self.prefill, key=lambda p: p.tokens)
        xs = [p.tokens for p in points]
        return _interpolate(xs, [p.seconds for p in points], tokens)

    def decode_step_seconds(self, batch: float, context: float) -> float:
        """One step's seconds with ``batch`` requests, each ``context`` tokens long."""
        grid = {(p.batch, p.context): p.seconds for p in self.decode}
        batches, contexts = self.batches, self.contexts
        per_context = [
            _interpolate(batches, [grid[b, c] for b in batches], batch) for c in contexts
        ]
        if len(contexts) == 1:
            return per_context[0]
        return _interpolate(contexts, per_context, context)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        raw = json.loads(Path(path).read_text())
        return cls(
            model=raw["model"],
            prefill=tuple(PrefillPoint(**p) for p in raw["prefill"]),
            decode=tuple(DecodePoint(**p) for p in raw["decode"]),
            meta=raw.get("meta", {}),
        )


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), sorted by x; linear beyond the ends; never below 0."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))
