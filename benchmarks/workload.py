"""The engine benchmark's workload: random token-id prompts with heavy-tailed output lengths.

Heterogeneous on purpose: static batching pays for the longest prompt and output of each batch,
continuous batching only for what each request needs. ``workload_flops`` counts the least work
the workload needs, for a compute bound.
"""

import math
import random
from typing import NamedTuple

from pdserve.engine.config import ModelConfig

SEED = 0


class WorkloadShape(NamedTuple):
    num_requests: int
    prompt_len: tuple[int, int]  # uniform, inclusive
    output_len: tuple[int, int]  # lognormal, clipped to this range
    output_median: int  # the lognormal's median before clipping
    output_sigma: float  # its log-space standard deviation: 1.0 gives a heavy tail


FULL = WorkloadShape(64, (16, 512), (8, 512), 64, 1.0)
QUICK = WorkloadShape(16, (8, 64), (4, 48), 12, 1.0)


class WorkItem(NamedTuple):
    prompt: list[int]
    output_len: int


def make_workload(vocab_size: int, shape: WorkloadShape, seed: int = SEED) -> list[WorkItem]:
    """Random token-id prompts and clipped-lognormal output lengths, in arrival order."""
    rng = random.Random(seed)
    items = []
    for _ in range(shape.num_requests):
        prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(*shape.prompt_len))]
        drawn = round(rng.lognormvariate(math.log(shape.output_median), shape.output_sigma))
        items.append(WorkItem(prompt, min(max(drawn, shape.output_len[0]), shape.output_len[1])))
    return items


def useful_tokens(workload: list[WorkItem]) -> int:
    return sum(item.output_len for item in workload)


def workload_flops(config: ModelConfig, workload: list[WorkItem]) -> float:
    """The least work the workload needs, counting matmuls and attention only.

    A request with prompt P and output L feeds n = P + L - 1 tokens through the layers (the last
    sampled token is never fed back) and runs the LM head for its L sampled tokens:
    ``2 * W * n + 2 * H * L + 4 * layers * heads * head_dim * n (n + 1) / 2``, where W is the
    layers' matmul weights (q, k, v, o, gate, up, down), H = vocab * hidden, and the last term is
    QK^T plus PV for a token at position p attending to p + 1 positions (causal).
    """
    h, hd, layers = config.hidden_size, config.head_dim, config.num_hidden_layers
    attn = h * hd * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    weights = layers * (attn + 3 * h * config.intermediate_size)
    head = config.vocab_size * h
    per_context = 4 * layers * config.num_attention_heads * hd
    total = 0.0
    for item in workload:
        n = len(item.prompt) + item.output_len - 1
        total += 2 * weights * n + 2 * head * item.output_len + per_context * n * (n + 1) / 2
    return total
