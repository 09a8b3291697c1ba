"""The planner's forecast of the next interval: Holt's linear trend (double exponential smoothing).

After each interval's observation ``y``:

    level' = alpha * y + (1 - alpha) * (level + trend)
    trend' = beta * (level' - level) + (1 - beta) * trend
    forecast = max(0, level' + trend')

A steady load forecasts itself; a rising one is forecast one step ahead of the last observation,
so the pools grow before the rise arrives rather than an interval after it. ``beta = 0`` makes it
an exponentially weighted mean (used for prompt and output lengths, which do not trend).
"""

from dataclasses import dataclass

DEFAULT_ALPHA = 0.5
DEFAULT_BETA = 0.5


@dataclass
class HoltPredictor:
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    level: float | None = None
    trend: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError(
                f"need 0 < alpha <= 1 and 0 <= beta <= 1, got {self.alpha}, {self.beta}"
            )

    def observe(self, value: float) -> None:
        if self.level is None:
            self.level = value
            return
        level = self.alpha * value + (1 - self.alpha) * (self.level + self.trend)
        self.trend = self.beta * (level - self.level) + (1 - self.beta) * self.trend
        self.level = level

    def forecast(self) -> float | None:
        """The next interval's value; None before the first observation."""
        if self.level is None:
            return None
        return max(0.0, self.level + self.trend)
