"""How many prefill and decode replicas a load needs to meet the TTFT and ITL targets.

**Prefill** (a replica prefills one prompt at a time: on a CPU, batching prompts does not add
throughput): a prompt of ``isl`` tokens takes ``s = c_p * profile.prefill_seconds(isl)``. With
``rate`` prompts/s over ``n`` replicas, each is busy ``rho = rate * s / n`` of the time, and a
prompt waits ``rho * s / (2 (1 - rho))`` before it starts (M/D/1), so

    TTFT(n) = s + rho * s / (2 * (1 - rho)).

The pool gets the smallest ``n`` with ``TTFT(n) <= ttft target``.

**Decode** (Little's law): requests stay ``osl`` steps, so ``rate * osl * t`` of them decode at
once when a step takes ``t``. A replica may run up to ``B``, the largest batch whose step
``t(B) = c_d * profile.decode_step_seconds(B, isl + osl / 2)`` meets the ITL target, and no more
than its engine runs at once (``max_num_seqs``); the pool gets ``ceil(rate * osl * t(B) / B)``
replicas.

An aggregated model's decode replicas prefill too: they get both counts added.

``c_p`` and ``c_d`` are the correction factors (Dynamo's): the observed TTFT and ITL over what
this model predicts for the observed load, so a profile measured on another machine, or a load
the model describes badly, is corrected by what the cluster shows.

**At capacity**: a profile times steps; it does not see room. A decode pool whose fullest replica's
KV cache is nearly full, or with requests waiting for a place in a batch, takes no more work
whatever its step times predict, so it gets a replica more than it has. A prefill pool that misses
its TTFT target while prompts queue on its replicas (more than one on a replica: it batches the
prompts that fit its token budget into one step, on a CPU no faster than one after another) loses
the time in its queue, which another replica shortens whatever the corrected profile says (the
correction is capped): it gets a replica more too. One that misses it with nothing queued does
not: each prompt's own prefill is too slow, and more replicas would not make it faster.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

from pdserve.cluster.planner.profile import Profile

MAX_UTILISATION = 0.95  # beyond it the queueing formula explodes; no pool is planned fuller
MIN_CORRECTION, MAX_CORRECTION = 0.25, 4.0  # one odd interval must not swing the plan far
KV_FULL = 0.95  # a decode replica's KV-cache usage from which it admits little more


@dataclass(frozen=True)
class Load:
    rate: float  # requests/s
    isl: float  # prompt tokens per request
    osl: float  # output tokens per request


@dataclass(frozen=True)
class Targets:
    ttft_s: float
    itl_s: float


class Need(NamedTuple):
    prefill: int
    decode: int


def predicted_ttft(profile: Profile, load: Load, replicas: int, correction: float = 1.0) -> float:
    """TTFT the model predicts for ``load`` on ``replicas`` prefill replicas (inf if saturated)."""
    s = correction * profile.prefill_seconds(load.isl)
    rho = load.rate * s / max(replicas, 1)
    if rho >= 1:
        return math.inf
    return s + rho * s / (2 * (1 - rho))


def prefill_replicas(profile: Profile, load: Load, targets: Targets, correction: float) -> int:
    if load.rate <= 0:
        return 0
    s = correction * profile.prefill_seconds(load.isl)
    n = max(1, math.ceil(load.rate * s / MAX_UTILISATION))
    # The service time alone may already miss the target: then the pool is sized for the
    # utilisation cap and the planner's bounds decide.
    while s < targets.ttft_s and predicted_ttft(profile, load, n, correction) > targets.ttft_s:
        n += 1
    return n


def decode_batch(
    profile: Profile, context: float, itl_s: float, correction: float, max_batch: int
) -> int:
    """The largest batch whose corrected step time meets ``itl_s`` (at least 1), no larger than
    ``max_batch``, the most requests a replica's engine runs at once (its ``max_num_seqs``)."""
    largest = min(max_batch, max(profile.batches) * 4)  # beyond 4x the profile is guesswork
    batch = 1
    while batch < largest and correction * profile.decode_step_seconds(batch + 1, context) <= itl_s:
        batch += 1
    return batch


def decode_replicas(
    profile: Profile, load: Load, targets: Targets, correction: float, max_batch: int
) -> int:
    if load.rate <= 0:
        return 0
    context = load.isl + load.osl / 2
    batch = decode_batch(profile, context, targets.itl_s, correction, max_batch)
    step = correction * profile.decode_step_seconds(batch, context)
    return max(1, math.ceil(load.rate * load.osl * step / batch))


def replicas_needed(
    profile: Profile,
    load: Load,
    targets: Targets,
    corrections: tuple[float, float],
    disaggregated: bool,
    max_batch: int,
) -> Need:
    prefill = prefill_replicas(profile, load, targets, corrections[0])
    decode = decode_replicas(profile, load, targets, corrections[1], max_batch)
    if not disaggregated:
        return Need(0, prefill + decode)
    return Need(prefill, decode)


def ratio(observed: float | None, predicted: float) -> float | None:
    """observed / predicted; None without an observation or a finite prediction."""
    if observed is None or not math.isfinite(predicted) or predicted <= 0:
        return None
    return observed / predicted


def bounded(value: float) -> float:
    """A correction held within [MIN_CORRECTION, MAX_CORRECTION]."""
    return min(MAX_CORRECTION, max(MIN_CORRECTION, value))


def prefill_at_capacity(ttft_s: float | None, target_s: float, queued: float | None) -> str | None:
    """Why the prefill pool's queue costs the TTFT target (the TTFT seen, the prompts queued on
    its replicas beyond one each), or None while the target is met or no prompt queues."""
    if ttft_s is None or ttft_s <= target_s or queued is None or queued < 1:
        return None
    return f"TTFT {ttft_s * 1e3:.0f} ms over {target_s * 1e3:.0f} ms, {queued:.0f} queued"


def decode_at_capacity(kv_usage: float | None, waiting: float | None) -> str | None:
    """Why the decode pool takes no more work (its fullest replica's KV usage, the requests
    waiting on its replicas), or None while it has room."""
    reasons = []
    if kv_usage is not None and kv_usage >= KV_FULL:
        reasons.append(f"KV {kv_usage:.0%}")
    if waiting is not None and waiting >= 1:
        reasons.append(f"{waiting:.0f} waiting")
    return ", ".join(reasons) or None
