"""``bench chaos``'s client loops against the local HTTP server of the tiny model (no Ray, no
kills): a stream read to its end carries exactly its ``max_tokens`` tokens, one the client
abandons stops short, and the engine frees every block once the loops are done."""

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pdserve.benchmarks.chaos import Draw
from pdserve.benchmarks.chaos_load import Outcome, run_load
from pdserve.benchmarks.openai_http import OpenAIClient
from pdserve.benchmarks.serve_bench.datasets import PromptShape
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests.e2e.local_client import LocalEngineClient

MODEL = "tiny"  # as conftest's server names it
STREAMS = 2
SECONDS = 3.0
# Seed 0 abandons the first stream's first request and the second stream's second.
DISCONNECT_FRACTION = 0.5
SHAPE = PromptShape(16, 24, 0.0, num_tenants=1, prefix_len=0, suffix_len=0)


async def _load(url: str, tokenizer: Tokenizer) -> list[Outcome]:
    draw = Draw(tokenizer, SHAPE, seed=0)
    async with OpenAIClient(url) as client:
        until = time.monotonic() + SECONDS
        return await run_load(client, MODEL, draw, STREAMS, DISCONNECT_FRACTION, until, seed=0)


def test_streams_end_whole_or_abandoned_and_free_their_blocks(
    http_url: str,
    tiny_model_dir: Path,
    local_client: LocalEngineClient,
    wait_idle: Callable[[LLMEngine], None],
) -> None:
    outcomes = asyncio.run(_load(http_url, Tokenizer.from_pretrained(tiny_model_dir)))
    endings = Counter(outcome.ending for outcome in outcomes)
    assert endings["failed"] == endings["refused"] == 0, outcomes
    assert endings["completed"] > 0 and endings["abandoned"] > 0, endings
    for outcome in outcomes:
        if outcome.ending == "completed":
            assert outcome.tokens == outcome.max_tokens == SHAPE.output_len
        else:
            assert 0 < outcome.tokens < outcome.max_tokens
    wait_idle(local_client.engine.engine)
