"""A client that goes away mid-request cancels it: the engine is told to abort (not left to run to
max_tokens) and every KV block is free again."""

from collections.abc import Callable

import openai
import pytest

from pdserve.engine.llm_engine import LLMEngine
from pdserve.tests.e2e.local_client import LocalEngineClient

MODEL = "tiny"
LONG = 1500  # tokens: far longer than a test waits, so only an abort can end it in time
CHUNKS_BEFORE_LEAVING = 2
NON_STREAMED_TIMEOUT_S = 1.0
LONG_BODY = {"model": MODEL, "max_tokens": LONG, "extra_body": {"ignore_eos": True}}


@pytest.fixture
def engine(local_client: LocalEngineClient) -> LLMEngine:
    return local_client.engine.engine


def _leave_after_a_few_chunks(stream: openai.Stream) -> None:
    for _, _chunk in zip(range(CHUNKS_BEFORE_LEAVING), stream, strict=False):
        pass
    stream.close()


def test_closing_a_streamed_completion_aborts_it(
    client: openai.OpenAI,
    engine: LLMEngine,
    aborted: list[str],
    wait_idle: Callable[[LLMEngine], None],
) -> None:
    _leave_after_a_few_chunks(client.completions.create(prompt="Once", stream=True, **LONG_BODY))
    wait_idle(engine)
    assert len(aborted) == 1 and aborted[0].startswith("cmpl-")


def test_closing_a_streamed_chat_with_n_aborts_every_choice(
    client: openai.OpenAI,
    engine: LLMEngine,
    aborted: list[str],
    wait_idle: Callable[[LLMEngine], None],
) -> None:
    messages = [{"role": "user", "content": "Tell a long story."}]
    _leave_after_a_few_chunks(
        client.chat.completions.create(messages=messages, n=2, stream=True, **LONG_BODY)
    )
    wait_idle(engine)
    assert len(aborted) == 2 and all(rid.startswith("chatcmpl-") for rid in aborted)


def test_a_client_timing_out_on_a_whole_completion_aborts_it(
    client: openai.OpenAI,
    engine: LLMEngine,
    aborted: list[str],
    wait_idle: Callable[[LLMEngine], None],
) -> None:
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=NON_STREAMED_TIMEOUT_S).completions.create(
            prompt="Once", **LONG_BODY
        )
    wait_idle(engine)
    assert len(aborted) == 1 and aborted[0].startswith("cmpl-")
