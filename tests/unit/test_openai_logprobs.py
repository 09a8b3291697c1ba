"""The engine's per-token logprobs in OpenAI's completions and chat formats."""

from pdserve.engine.outputs import Logprob
from pdserve.router.api.logprobs import chat_logprobs, completion_logprobs

# Two positions: the sampled token (ids 7, then 9) plus the top-2 the engine returned. At the
# second, the sampled token is not among the top 2 (sampling at a temperature).
TOKEN_IDS = [7, 9]
POSITIONS = [
    {7: Logprob(-0.1, 1, "He"), 8: Logprob(-2.0, 2, "She")},
    {9: Logprob(-3.0, 5, " ran"), 4: Logprob(-0.5, 1, " was"), 5: Logprob(-1.5, 2, " is")},
]


def test_completion_format() -> None:
    logprobs = completion_logprobs(TOKEN_IDS, POSITIONS, text_offset=10)
    assert logprobs.tokens == ["He", " ran"]
    assert logprobs.token_logprobs == [-0.1, -3.0]
    assert logprobs.top_logprobs == [
        {"He": -0.1, "She": -2.0},
        {" ran": -3.0, " was": -0.5, " is": -1.5},
    ]
    assert logprobs.text_offset == [10, 12]  # each token's own decoded length advances it


def test_chat_format_keeps_the_top_n_by_rank() -> None:
    content = chat_logprobs(TOKEN_IDS, POSITIONS, num_top=2).content
    assert [(c.token, c.logprob, c.bytes) for c in content] == [
        ("He", -0.1, list(b"He")),
        (" ran", -3.0, list(b" ran")),
    ]
    assert [[t.token for t in c.top_logprobs] for c in content] == [["He", "She"], [" was", " is"]]
    assert chat_logprobs(TOKEN_IDS, POSITIONS, num_top=0).content[0].top_logprobs == []


def test_tokens_as_ids() -> None:
    assert completion_logprobs(TOKEN_IDS, POSITIONS, 0, as_ids=True).tokens == [
        "token_id:7",
        "token_id:9",
    ]
    content = chat_logprobs(TOKEN_IDS, POSITIONS, num_top=1, as_ids=True).content
    assert [c.token for c in content] == ["token_id:7", "token_id:9"]
    assert content[1].top_logprobs[0].token == "token_id:4"
