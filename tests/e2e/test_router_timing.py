"""The router's per-request timings (``router/timing.py``): every request that reaches an engine is
logged once, its parts in order; the router's own share is the rest of its TTFT."""

import openai
import pytest

from pdserve.router.timing import TimingLog

MODEL = "tiny"
GREEDY = {"temperature": 0, "max_tokens": 4, "extra_body": {"ignore_eos": True}}


def _check(timing: dict) -> None:
    names = ("arrival", "body_received", "upstream_call", "upstream_first", "first_byte")
    stamps = [timing[name] for name in names]
    assert stamps == sorted(stamps), timing
    total = timing["first_byte"] - timing["body_received"]
    upstream = timing["upstream_first"] - timing["upstream_call"]
    assert timing["router_seconds"] == pytest.approx(total - upstream)
    assert 0 < timing["router_seconds"] < total
    assert 0 < timing["engine_ttft"] < upstream


def test_each_engine_request_logs_its_timings_once(
    timed_client: openai.OpenAI, timing_log: TimingLog
) -> None:
    client = timed_client
    client.completions.create(model=MODEL, prompt="Hello", **GREEDY)
    for _ in client.completions.create(model=MODEL, prompt="Hello", stream=True, **GREEDY):
        pass
    # A chat stream sends its role chunk before any token: the first byte counted is after it.
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True, **GREEDY
    )
    for _ in chat:
        pass
    client.models.list()  # reaches no engine: not logged
    with pytest.raises(openai.BadRequestError):  # refused before any engine: not logged
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=-1)
    timings = timing_log.take()
    assert len(timings) == 3
    for timing in timings:
        _check(timing)
    assert timing_log.take() == []
