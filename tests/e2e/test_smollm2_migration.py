"""The real model after a fault: SmolLM2 served disaggregated (1 prefill + 2 decode replicas), its
chat parity prompts and its two longest raw ones streamed at once (HTTP and gRPC in turn; the long
ones prefill remotely and cross over NIXL), the busiest decode replica SIGKILLed mid-stream: every
stream goes on at the other replica and carries exactly the offline engine's greedy tokens, which
``tests/unit/test_gguf_parity.py`` holds equal to transformers'.

Minutes on two cores, so ``make test`` leaves it to ``make test-real-model`` (marker
``real_model``); the tiny model's version of it is in ``test_migration.py``.
"""

import pytest

from pdserve import LLM
from pdserve.tests.e2e.serve_replicas import offline_greedy
from pdserve.tests.e2e.streams import through_a_decode_kill, wait_for_replicas
from pdserve.tests.gguf_models import smollm2_or_skip
from pdserve.tests.smollm2_prompts import RAW_LENGTHS, parity_prompts

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

MODEL = "smollm2"
DECODE_REPLICAS = 2
LOCAL_PREFILL_MAX_TOKENS = 256  # the two long raw prompts prefill at the prefill replica
# Long enough that every stream is still running at the kill, and for a while after its move.
MAX_TOKENS = 128
TOKENS_BEFORE_KILL = 12


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    gguf = smollm2_or_skip()
    model = {
        "name": MODEL,
        "path": str(gguf),
        "prefill": {"replicas": 1},
        "decode": {"replicas": DECODE_REPLICAS},
        "routing": {"local_prefill_max_tokens": LOCAL_PREFILL_MAX_TOKENS},
        "migration_limit": 1,
    }
    with ray_cluster.serving(ray_cluster.config([model])) as config:
        yield config


@pytest.mark.timeout(900)
def test_streams_of_a_killed_decode_replica_end_with_the_offline_tokens(cluster):
    llm = LLM(model=smollm2_or_skip())  # fp32, as served
    prompts = parity_prompts(llm.get_tokenizer())[len(RAW_LENGTHS) - 2 :]
    expected = offline_greedy(llm, prompts, MAX_TOKENS)
    del llm
    wait_for_replicas(f"decode-{MODEL}", DECODE_REPLICAS)
    streams, moved, migrated = through_a_decode_kill(
        cluster, MODEL, prompts, MAX_TOKENS, TOKENS_BEFORE_KILL
    )
    assert [s.error for s in streams] == [None] * len(streams)
    for prompt, stream, want in zip(prompts, streams, expected, strict=True):
        assert stream.tokens == want, f"prompt of {len(prompt)} tokens diverged"
    assert migrated == moved >= 1
