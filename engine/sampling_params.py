"""Per-request sampling parameters: vLLM's names, defaults and validation ranges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

# Temperatures below this mean greedy (vLLM's _SAMPLING_EPS): dividing by ~0 overflows the logits.
GREEDY_EPS = 1e-5
# Most completions one request may ask for (OpenAI's bound): each is an engine request of its
# own, so an unbounded n would let one request flood the router and the engines.
MAX_N = 128
# Most top logprobs one request may ask for (vLLM's default `max_logprobs`).
MAX_LOGPROBS = 20
# OpenAI's (and vLLM's) range for presence/frequency penalties.
MAX_ABS_ADDITIVE_PENALTY = 2.0
# What torch.Generator.manual_seed accepts (a signed or unsigned 64-bit value).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


def _check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def _is_int(value: object) -> bool:
    # bool is an int subclass, but `seed=True` is a caller bug, not a seed.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next tokens of one request; `stop`, `stop_token_ids` are stored as tuples."""

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # top logprobs returned besides the sampled token's
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        stop = (
            () if self.stop is None else (self.stop,) if isinstance(self.stop, str) else self.stop
        )
        object.__setattr__(self, "stop", tuple(stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"in [1, {MAX_N}]", self.n)
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", ">= 1", self.max_tokens
        )
        _check(self.temperature >= 0, "temperature", ">= 0", self.temperature)
        _check(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _check(
            _is_int(self.top_k) and self.top_k >= -1,
            "top_k",
            "-1, 0 (disabled) or >= 1",
            self.top_k,
        )
        _check(0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        bound = MAX_ABS_ADDITIVE_PENALTY
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-bound <= value <= bound, name, f"in [{-bound}, {bound}]", value)
        _check(self.repetition_penalty > 0, "repetition_penalty", "> 0", self.repetition_penalty)
        _check(
            self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX),
            "seed",
            f"None or an int in [{SEED_MIN}, {SEED_MAX}]",
            self.seed,
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings", self.stop
        )
        _check(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "ints >= 0",
            self.stop_token_ids,
        )
        _check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens,
            "min_tokens",
            f">= 0 and <= max_tokens ({self.max_tokens})",
            self.min_tokens,
        )
        _check(
            self.logprobs is None
            or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            "logprobs",
            f"None or in [0, {MAX_LOGPROBS}]",
            self.logprobs,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )


def fan_out(params: SamplingParams) -> list[SamplingParams]:
    """n completions become n requests; seeded ones get distinct, reproducible seeds."""
    if params.n == 1:
        return [params]
    return [
        replace(params, n=1, seed=None if params.seed is None else params.seed + i)
        for i in range(params.n)
    ]
