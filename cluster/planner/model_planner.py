"""One model's planning step: observe the last interval, correct the profile, forecast the next,
size both pools in one decision, and hold it to each pool's bounds, step and hysteresis.

Pure: what the cluster showed comes in as an ``Observation`` (``prometheus_source.py`` reads it
from Prometheus), the replica counts go out in a ``Decision`` (``deployment.py`` applies them
through ``serve_scaler.py``).
"""

from dataclasses import dataclass

from pdserve.cluster.planner.policy import PoolPolicy
from pdserve.cluster.planner.predictor import HoltPredictor
from pdserve.cluster.planner.profile import Profile
from pdserve.cluster.planner.sizing import (
    Load,
    Targets,
    bounded,
    decode_at_capacity,
    predicted_ttft,
    prefill_at_capacity,
    ratio,
    replicas_needed,
)


@dataclass(frozen=True)
class Observation:
    """One model over the last interval; a figure is None when no request gave it."""

    rate: float  # requests started per second
    isl: float | None  # prompt tokens per request
    osl: float | None  # output tokens per request
    ttft_s: float | None  # mean time to first token
    itl_s: float | None  # mean inter-token latency
    decode_batch: float | None  # mean requests running on a decode replica
    decode_kv_usage: float | None = None  # the fullest decode replica's KV usage (0..1), mean
    decode_waiting: float | None = None  # requests waiting on the decode replicas, mean
    prefill_queued: float | None = None  # prompts on the prefill replicas beyond one each, mean


@dataclass(frozen=True)
class Decision:
    prefill: int
    decode: int
    reason: str  # one log line's worth: the forecast, the corrections, each pool's why


class ModelPlanner:
    def __init__(
        self,
        name: str,
        profile: Profile,
        targets: Targets,
        prefill: PoolPolicy | None,  # None: the model is served aggregated
        decode: PoolPolicy,
        max_batch: int,  # the most requests a decode replica runs at once (max_num_seqs)
    ) -> None:
        self.name = name
        self.profile = profile
        self.targets = targets
        self.prefill = prefill
        self.decode = decode
        self.max_batch = max_batch
        self.rate = HoltPredictor()
        self.isl = HoltPredictor(beta=0.0)
        self.osl = HoltPredictor(beta=0.0)
        self.corrections = (1.0, 1.0)  # prefill, decode: the last ones observed
        self.ratios: tuple[float | None, float | None] = (None, None)  # before their bounds

    def step(self, seen: Observation, current: tuple[int, int]) -> Decision:
        """The replica counts (prefill, decode) to have next, given those there are now."""
        self._correct(seen, current)
        self.rate.observe(seen.rate)
        if seen.isl is not None and seen.osl is not None:
            self.isl.observe(seen.isl)
            self.osl.observe(seen.osl)
        isl, osl = self.isl.forecast(), self.osl.forecast()
        if isl is None or osl is None:  # no request yet: nothing to size from
            load = Load(0.0, 0.0, 0.0)
        else:
            load = Load(self.rate.forecast() or 0.0, isl, osl)
        need = replicas_needed(
            self.profile,
            load,
            self.targets,
            self.corrections,
            self.prefill is not None,
            self.max_batch,
        )
        prefill, why_prefill = 0, "none"
        if self.prefill is not None:
            queued = prefill_at_capacity(seen.ttft_s, self.targets.ttft_s, seen.prefill_queued)
            wanted = need.prefill if queued is None else max(need.prefill, current[0] + 1)
            prefill, why_prefill = self.prefill.next(current[0], wanted)
            if queued is not None:
                why_prefill += f"; at capacity: {queued}"
        full = decode_at_capacity(seen.decode_kv_usage, seen.decode_waiting)
        wanted = need.decode if full is None else max(need.decode, current[1] + 1)
        decode, why_decode = self.decode.next(current[1], wanted)
        if full is not None:
            why_decode += f"; at capacity: {full}"
        prefill_c, decode_c = (
            _with_cap(c, r) for c, r in zip(self.corrections, self.ratios, strict=True)
        )
        reason = (
            f"{self.name}: seen {seen.rate:.2f} req/s, TTFT {_ms(seen.ttft_s)}, ITL "
            f"{_ms(seen.itl_s)}; forecast {load.rate:.2f} req/s, ISL {load.isl:.0f}, OSL "
            f"{load.osl:.0f}; corrections prefill {prefill_c}, decode {decode_c}; prefill "
            f"{current[0]} -> {prefill} ({why_prefill}); decode {current[1]} -> {decode} "
            f"({why_decode})"
        )
        return Decision(prefill, decode, reason)

    def _correct(self, seen: Observation, current: tuple[int, int]) -> None:
        # Observed over predicted, for the load as it was: each pool's profile correction.
        if seen.isl is None or seen.osl is None or seen.rate <= 0:
            return
        load = Load(seen.rate, seen.isl, seen.osl)
        prefilling = current[0] if self.prefill is not None else current[1]
        r_p = ratio(seen.ttft_s, predicted_ttft(self.profile, load, prefilling))
        r_d = None
        if seen.decode_batch is not None:
            context = seen.isl + seen.osl / 2
            step = self.profile.decode_step_seconds(max(seen.decode_batch, 1.0), context)
            r_d = ratio(seen.itl_s, step)
        # An interval without its figure keeps the correction (and the ratio) it had.
        self.ratios = (
            self.ratios[0] if r_p is None else r_p,
            self.ratios[1] if r_d is None else r_d,
        )
        self.corrections = (
            self.corrections[0] if r_p is None else bounded(r_p),
            self.corrections[1] if r_d is None else bounded(r_d),
        )


def _with_cap(value: float, raw: float | None) -> str:
    """A correction as the log shows it, with the ratio it was capped from, if it was."""
    if raw is None or bounded(raw) == raw:
        return f"{value:.2f}"
    return f"{value:.2f} (capped from {raw:.2f})"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"
