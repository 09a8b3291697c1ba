"""When a benchmark sends its requests: seeded offsets from the run's start.

Gaps are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``, as vLLM's
``--burstiness``: 1 is a Poisson process, below 1 burstier, above 1 steadier. A ramp steps the rate
through stages (``rate:seconds,...``).
"""

import math
import random
from typing import NamedTuple

POISSON = 1.0  # the burstiness of a Poisson process (exponential gaps)


class Stage(NamedTuple):
    rate: float  # requests/s
    seconds: float


def parse_stages(text: str) -> list[Stage]:
    """``"1:30,6:45"`` -> 1 request/s for 30 s, then 6 for 45 s."""
    stages = []
    for part in text.split(","):
        rate, _, seconds = part.partition(":")
        stage = Stage(float(rate), float(seconds))
        if stage.rate <= 0 or stage.seconds <= 0:
            raise ValueError(f"a stage is rate:seconds, both > 0; got {part!r}")
        stages.append(stage)
    return stages


def _gap(rng: random.Random, rate: float, burstiness: float) -> float:
    # Gamma(k, 1 / (rate k)) has mean 1 / rate for every k; k = 1 is the exponential.
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def _check_burstiness(burstiness: float) -> None:
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")


def arrival_offsets(
    num_requests: int, rate: float, seed: int, burstiness: float = POISSON
) -> list[float]:
    """Send times from the start at ``rate`` requests/s on average, the first at 0; ``rate`` inf
    sends them all at once."""
    _check_burstiness(burstiness)
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(num_requests - 1):
        offsets.append(offsets[-1] + _gap(rng, rate, burstiness))
    return offsets[:num_requests]


def send_times(stages: list[Stage], seed: int, burstiness: float = POISSON) -> list[float]:
    """Arrivals whose rate steps through the stages, as offsets from the start."""
    _check_burstiness(burstiness)
    rng, times, start = random.Random(seed), [], 0.0
    for stage in stages:
        t = start + _gap(rng, stage.rate, burstiness)
        while t < start + stage.seconds:
            times.append(t)
            t += _gap(rng, stage.rate, burstiness)
        start += stage.seconds
    return times
