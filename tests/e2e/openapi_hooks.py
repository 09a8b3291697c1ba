"""schemathesis hooks for ``test_openapi.py``, loaded by its CLI (``SCHEMATHESIS_HOOKS``).

Before each request is sent (every phase), its engine work is bounded: its completion budget and
``n`` capped (and the budget set where a missing one means "the rest of the context"), and a
named model pointed at the served one, so the run fits the test's time and reaches the engines
instead of stopping at "no such model". ``min_tokens`` is capped at that budget: the server
refuses it above the budget, a rule between two fields that JSON Schema cannot state. Values
of the wrong type are left for the server to refuse. Generated bodies that do not say are
streamed half the time (``stream`` is rarely drawn). The document itself is not changed.
"""

from typing import Any

import schemathesis
from hypothesis import strategies as st

from pdserve.engine.sampling_params import SEED_MAX, SEED_MIN

MODEL = "tiny"
MAX_TOKENS = 4  # per generated completion: the tiny model on 2 busy cores
MAX_N = 2
# Each generation endpoint's completion budget: the field, and the others that may hold it.
BUDGET = {"/v1/completions": "max_tokens", "/v1/chat/completions": "max_completion_tokens"}
BOUNDS = {"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS, "n": MAX_N}


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: Any) -> None:
    body = case.body
    if not isinstance(body, dict) or case.path not in BUDGET:
        return
    body.setdefault(BUDGET[case.path], None)
    for field, bound in BOUNDS.items():
        if field in body and _over(body[field], bound):
            body[field] = bound
    budget, least = body[BUDGET[case.path]], body.get("min_tokens")
    if _is_int(budget) and _is_int(least) and least > budget:
        body["min_tokens"] = budget
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    # schemathesis checks a bound in floating point, so a valid case's seed may be a little past
    # 2**64 (within a float's precision of the bound): it goes as the bound.
    seed = body.get("seed")
    if case.meta is not None and case.meta.generation.mode.is_positive and _is_int(seed):
        body["seed"] = min(max(int(seed), SEED_MIN), SEED_MAX)


@schemathesis.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy:
    if not isinstance(body, dict) or "stream" in body or body.get("stream_options") is not None:
        return st.just(body)
    return st.booleans().map(lambda stream: {**body, "stream": stream})


def _over(value: Any, bound: int) -> bool:
    """None (the most there is) or an int above ``bound``."""
    return value is None or (_is_int(value) and value > bound)


def _is_int(value: Any) -> bool:
    # As JSON Schema reads a number: 2.0 is an integer, true is not.
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)
