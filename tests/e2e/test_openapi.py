"""The OpenAPI document tells the truth: schemathesis generates requests for every operation of
``/openapi.json`` (valid ones and invalid ones) against the local HTTP server, and every answer
must have a documented status, a documented content type and a body matching the documented
schema (server-sent events included), and never be a server error.

A hook bounds the engine work of each generated request (``max_tokens``, ``n``), points a named
model at the served one and streams half the requests that do not say, so the examples fit the
test's time and reach the engines and the event streams instead of stopping at "no such model";
the document itself is not changed.
"""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

MODEL = "tiny"
MAX_TOKENS = 4  # per generated completion: the tiny model on 2 busy cores
MAX_N = 2
MAX_EXAMPLES = 100  # per operation
TIMEOUT_S = 30.0  # per request
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
SERVERS = ["http_url", "keyed_http_url"]  # fixtures: the open server, the one with API keys
OPERATIONS = ["GET /health", "GET /v1/models", "POST /v1/completions", "POST /v1/chat/completions"]
WITH_BODY = OPERATIONS[2:]
# Invalid requests only where there is something to get wrong: the GETs take no input.
CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + [
    (label, GenerationMode.NEGATIVE) for label in WITH_BODY
]
BOUNDED_FIELDS = {"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS, "n": MAX_N}


def _steered(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy:
    """``body`` with its sizes capped (and set where a missing one means "the rest of the
    context"), and streamed or not where it does not say (as often as not: few generated bodies
    name the field); values of the wrong type are left for the server to refuse."""
    if not isinstance(body, dict):
        return st.just(body)
    for field, bound in BOUNDED_FIELDS.items():
        value = body.get(field)
        if value is None or (isinstance(value, int) and value > bound):
            body[field] = bound
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    if "stream" in body:
        return st.just(body)
    return st.booleans().map(lambda stream: {**body, "stream": stream})


@pytest.fixture(scope="module", params=SERVERS)
def api_schema(request: pytest.FixtureRequest) -> schemathesis.BaseSchema:
    """The document of each server: open, and one that asks for API keys (whose 401s the
    generated requests, sending made-up keys or none, must meet as documented)."""
    url = request.getfixturevalue(request.param)
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    schema.hook("flatmap_body")(_steered)
    return schema


def test_the_document_has_these_operations(api_schema: schemathesis.BaseSchema) -> None:
    labels = [result.ok().label for result in api_schema.get_all_operations()]
    assert labels == OPERATIONS


# schemathesis' own pytest plugin (`from_fixture` + `parametrize`) fails under pytest 9 (it reads
# a node attribute pytest removed): each operation's cases are driven through Hypothesis here.
@pytest.mark.parametrize(("label", "mode"), CASES)
def test_every_answer_is_documented(
    api_schema: schemathesis.BaseSchema, label: str, mode: GenerationMode
) -> None:
    operation = api_schema.find_operation_by_label(label)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,  # the same cases every run: a failure is never a matter of luck
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def answer_is_documented(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS, timeout=TIMEOUT_S)

    answer_is_documented()
