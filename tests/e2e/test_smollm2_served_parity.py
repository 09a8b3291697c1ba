"""The real model through the default cluster: ``pdserve serve`` with no model serves SmolLM2
disaggregated (one prefill and one decode replica), and the greedy tokens of the 16 parity prompts
(``tests/smollm2_prompts.py``), sent at once, equal the offline engine's, which
``tests/unit/test_gguf_parity.py`` holds equal to transformers'. The long prompts prefill remotely
and cross to the decode replica over NIXL (counted on /metrics).

Minutes on two cores (SmolLM2's 16 x 64 tokens beside the suite's other run), so ``make test``
leaves it to ``make test-real-model`` (marker ``real_model``)."""

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from pdserve import LLM
from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.serve import free_port
from pdserve.tests.e2e.serve_replicas import offline_greedy
from pdserve.tests.gguf_models import smollm2_or_skip
from pdserve.tests.serve_process import pdserve_serve
from pdserve.tests.smollm2_prompts import MAX_NEW_TOKENS, parity_prompts

pytestmark = [pytest.mark.slow, pytest.mark.own_ray_cluster, pytest.mark.real_model]

MODEL = "SmolLM2-135M-Instruct"
GREEDY_IDS = {"ignore_eos": True, "return_tokens_as_token_ids": True}
# The decode replica's KV transfers, summed over its series (Ray exports them within seconds).
KV_TRANSFERS = re.compile(r'^ray_pdserve_kv_transfers_total\{[^}]*pool="decode".*\} (\S+)$', re.M)
METRICS_WAIT_S = 30.0


@pytest.mark.timeout(900)
def test_served_greedy_tokens_equal_the_offline_engine_s(tmp_path: Path) -> None:
    gguf = smollm2_or_skip()
    llm = LLM(model=gguf)  # fp32, as served
    prompts = parity_prompts(llm.get_tokenizer())
    want = offline_greedy(llm, prompts, MAX_NEW_TOKENS)
    del llm
    http_port = free_port()
    flags = ["--http-port", str(http_port), "--grpc-port", str(free_port())]
    base_url = f"http://127.0.0.1:{http_port}/v1"
    with pdserve_serve(flags, tmp_path):
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:

            def served(prompt: list[int]) -> list[int]:
                completion = client.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=MAX_NEW_TOKENS, temperature=0,
                    logprobs=0, extra_body=GREEDY_IDS,
                )  # fmt: skip
                return token_ids(completion.choices[0].logprobs.tokens)

            with ThreadPoolExecutor(len(prompts)) as pool:  # batched at the decode replica
                got = list(pool.map(served, prompts))
        for prompt, mine, theirs in zip(prompts, got, want, strict=True):
            assert mine == theirs, f"prompt of {len(prompt)} tokens diverged"
        deadline = time.monotonic() + METRICS_WAIT_S
        while not _kv_transfers(base_url):
            assert time.monotonic() < deadline, "no KV transfer counted: no prompt went remote"
            time.sleep(1.0)


def _kv_transfers(base_url: str) -> float:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as page:
        return sum(float(n) for n in KV_TRANSFERS.findall(page.read().decode()))
