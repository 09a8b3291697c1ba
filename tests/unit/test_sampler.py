import math

import pytest
import torch

from pdserve.engine.logits_processors import (
    TOP_P_CANDIDATES,
    TOP_P_CANDIDATES_GROWTH,
    apply_penalties,
    apply_top_k_top_p,
)
from pdserve.engine.sampler import Sampler, SamplingRow, make_generator, token_seed
from pdserve.engine.sampling_params import SamplingParams

EOS = 3
VOCAB = 64
# chi-square critical values at p = 0.001 (5 and 2 degrees of freedom): a fixed-seed run that
# follows the distribution sits far below.
CHI2_CRITICAL_DF5 = 20.52
CHI2_CRITICAL_DF2 = 13.82


def row(output: list[int] | None = None, prompt: list[int] | None = None, **kwargs) -> SamplingRow:
    params = SamplingParams(**kwargs)
    return SamplingRow(params, prompt or [1, 2], output or [], make_generator(params, "cpu"))


def random_logits(batch: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def support(logits: torch.Tensor, samples: int = 4000, **kwargs) -> set[int]:
    """Tokens drawn from one logits row [V] over many identical rows with a fixed sampler seed."""
    rows = [row(**kwargs)] * samples
    return set(Sampler([EOS], seed=0)(logits.expand(samples, -1).contiguous(), rows).token_ids)


def test_greedy_is_argmax_and_logits_untouched() -> None:
    logits = random_logits(8)
    before = logits.clone()
    out = Sampler([EOS])(logits, [row(temperature=0) for _ in range(8)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 8
    assert torch.equal(logits, before)


@pytest.mark.parametrize("kwargs", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_degenerate_filters_equal_greedy(kwargs: dict) -> None:
    logits = random_logits(32)
    rows = [row(temperature=1.5, seed=i, **kwargs) for i in range(32)]
    assert Sampler([EOS], seed=0)(logits, rows).token_ids == logits.argmax(-1).tolist()


PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"min_p": 0.3}, {0, 1, 2}),  # keeps p >= 0.3 * 0.4 = 0.12
        ({"top_k": 3}, {0, 1, 2}),
        ({"top_p": 0.6}, {0, 1}),  # 0.4 < 0.6, 0.4 + 0.25 reaches it
        ({"top_p": 0.7}, {0, 1, 2}),
        ({"top_k": 4, "min_p": 0.3}, {0, 1, 2}),
        ({}, {0, 1, 2, 3, 4, 5}),
    ],
)
def test_filters_keep_exactly_the_expected_support(kwargs: dict, expected: set[int]) -> None:
    assert support(PROBS.log(), **kwargs) == expected


def test_candidate_top_p_equals_full_sort_at_every_tier() -> None:
    vocab = 16 * TOP_P_CANDIDATES
    scale = torch.tensor([[1.0], [0.5], [0.5], [1.0], [1.0], [1.0], [1.0]])
    logits = random_logits(7, vocab) * scale  # flatter rows push the top-p cut further out
    top_k = [0, 0, 0, 50, 2 * TOP_P_CANDIDATES, 0, 3]
    top_p = [0.9, 0.9, 0.99, 0.8, 0.99, 1e-4, 0.999]
    params = [SamplingParams(top_k=k, top_p=p) for k, p in zip(top_k, top_p, strict=True)]
    fast = apply_top_k_top_p(logits, params)
    exact = apply_top_k_top_p(logits, params, candidates=vocab)  # a full sort
    assert torch.equal(fast.isinf(), exact.isinf())
    kept = ~exact.isinf()
    assert torch.equal(fast[kept], logits[kept])
    sizes = kept.sum(-1).tolist()
    second_tier = TOP_P_CANDIDATES * TOP_P_CANDIDATES_GROWTH
    assert sizes[0] < TOP_P_CANDIDATES < sizes[1] < second_tier < sizes[2]
    assert sizes[3] <= 50 and TOP_P_CANDIDATES < sizes[4] <= 2 * TOP_P_CANDIDATES
    assert sizes[5:] == [1, 3]


def run_steps(layout: list[SamplingRow], target: int, steps: int = 12) -> list[int]:
    """Tokens of layout[target] over `steps` steps; other rows get unrelated logits each step.
    Each row's output grows by its token, as in the engine (a seeded row's draw depends on it)."""
    sampler, tokens = Sampler([EOS], seed=123), []
    for step in range(steps):
        logits = random_logits(len(layout), seed=1000 + step)
        logits[target] = random_logits(1, seed=step)[0] * 0.3  # flat enough to make draws vary
        sampled = sampler(logits, layout).token_ids
        for r, token in zip(layout, sampled, strict=True):
            r.output_token_ids.append(token)
        tokens.append(sampled[target])
    return tokens


def test_seeded_rows_reproducible_regardless_of_batch() -> None:
    alone = run_steps([row(seed=7)], target=0)
    assert alone == run_steps([row(seed=7)], target=0)
    crowded = [row(), row(temperature=0), row(seed=8, top_p=0.9), row(seed=7), row(top_k=5)]
    crowded.append(row(output=[1, 2], presence_penalty=0.5, min_tokens=4))
    assert run_steps(crowded, target=3) == alone
    assert len(set(alone)) > 3


def test_different_seeds_give_different_sequences() -> None:
    sequences = {tuple(run_steps([row(seed=s)], target=0)) for s in range(5)}
    assert len(sequences) == 5


def test_a_seeded_token_depends_on_its_seed_and_index_alone() -> None:
    # What lets a decode replica continue a stream that a prefill replica began: the draw for
    # the k-th token needs no generator state carried over, only the seed and k.
    logits = random_logits(1) * 0.3  # flat: the draw, not the logits, picks the token
    stream = row(seed=7)
    for _ in range(8):
        stream.output_token_ids += Sampler([EOS], seed=1)(logits, [stream]).token_ids
    tokens = list(stream.output_token_ids)
    assert len(set(tokens)) > 3
    for k in range(len(tokens)):  # a new engine's request, k tokens in
        fresh = row(seed=7, output=tokens[:k])
        assert Sampler([EOS], seed=2)(logits, [fresh]).token_ids == [tokens[k]], k
    assert len({token_seed(7, 0), token_seed(7, 1), token_seed(8, 0)}) == 3


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    logits = random_logits(16) * 0.2
    rows = [row() for _ in range(16)]
    assert Sampler([EOS], seed=1)(logits, rows) == Sampler([EOS], seed=1)(logits, rows)
    assert Sampler([EOS], seed=1)(logits, rows) != Sampler([EOS], seed=2)(logits, rows)


def test_penalty_formulas_on_a_tiny_vocab() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 1.0, 0.0]])
    penalised = row(
        prompt=[0, 1, 2],
        output=[2, 2, 3],
        repetition_penalty=2.0,
        frequency_penalty=0.1,
        presence_penalty=0.3,
    )
    # repetition over prompt+output {0,1,2,3}: 2/2, -1*2, 0.5/2, -0.5*2; then output counts
    # {2: 2, 3: 1}: token 2 -= 0.1*2 + 0.3, token 3 -= 0.1*1 + 0.3; tokens 4, 5 untouched.
    expected = torch.tensor([[1.0, -2.0, 0.25 - 0.5, -1.0 - 0.4, 1.0, 0.0]])
    negative = row(output=[4, 4], frequency_penalty=-1.0, presence_penalty=-0.5)
    untouched = row(output=[0, 1], prompt=[2])
    batch = torch.cat([logits, logits, logits])
    apply_penalties(batch, [penalised, negative, untouched])
    torch.testing.assert_close(batch[0:1], expected)
    torch.testing.assert_close(batch[1:2], torch.tensor([[2.0, -1.0, 0.5, -0.5, 3.5, 0.0]]))
    torch.testing.assert_close(batch[2:3], logits)


def test_penalties_steer_greedy_choice_per_row() -> None:
    logits = torch.tensor([[2.0, 1.5, 0.0, 0.0], [2.0, 1.5, 0.0, 0.0]])
    rows = [
        row(output=[0], prompt=[2], temperature=0, repetition_penalty=2.0),
        row(output=[0], temperature=0),
    ]
    assert Sampler([EOS])(logits, rows).token_ids == [1, 0]


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    logits = torch.zeros(4, 8)
    logits[:, EOS] = 10.0
    logits[:, 5] = 9.0
    rows = [
        row(output=[1], min_tokens=2, temperature=0, stop_token_ids=[5]),
        row(output=[1, 1], min_tokens=2, temperature=0),  # reached min_tokens: EOS allowed
        row(output=[1], min_tokens=2, temperature=0, ignore_eos=True),  # EOS is no stop here
        row(output=[1], min_tokens=2, stop_token_ids=[5]),  # random row
    ]
    out = Sampler([EOS], seed=0)(logits, rows).token_ids
    assert out[:3] == [next(i for i in range(8) if i not in (EOS, 5)), EOS, EOS]
    assert out[3] not in (EOS, 5)
    many = support(logits[0], min_tokens=3, stop_token_ids=[5], temperature=0.5)
    assert EOS not in many and 5 not in many


def test_logprobs_are_raw_log_softmax_with_sorted_top_n() -> None:
    logits = random_logits(4)
    rows = [
        row(logprobs=5, temperature=0.7, repetition_penalty=1.5, output=[9, 9]),
        row(),
        row(logprobs=0, temperature=0),
        row(logprobs=20, top_k=3),
    ]
    before = logits.clone()
    out = Sampler([EOS], seed=0)(logits, rows)
    assert torch.equal(logits, before)  # penalties and temperature worked on a copy
    expected = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    for i in (0, 2, 3):
        entry = out.logprobs[i]
        assert entry is not None and entry.token_id == out.token_ids[i]
        assert entry.logprob == pytest.approx(expected[i, entry.token_id].item(), abs=1e-6)
        assert entry.rank == int((expected[i] >= expected[i, entry.token_id]).sum())
        n = rows[i].params.logprobs
        assert len(entry.top) == n
        top_values, top_ids = expected[i].topk(n) if n else (torch.empty(0), torch.empty(0))
        assert [t for t, _ in entry.top] == top_ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(top_values.tolist(), abs=1e-6)
        assert all(a[1] >= b[1] for a, b in zip(entry.top, entry.top[1:], strict=False))
    assert out.logprobs[2].rank == 1  # greedy took the raw argmax (no penalties there)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_sampling_frequencies_match_softmax(temperature: float) -> None:
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2])
    samples = 30000
    rows = [row(temperature=temperature)] * samples
    tokens = Sampler([EOS], seed=0)(logits.expand(samples, -1).contiguous(), rows).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=6).double()
    assert chi_square(counts, torch.softmax(logits.double() / temperature, -1)) < CHI2_CRITICAL_DF5
    if not math.isclose(temperature, 1.0):
        # The check is sharp enough to tell the temperature was applied.
        assert chi_square(counts, torch.softmax(logits.double(), -1)) > 10 * CHI2_CRITICAL_DF5


def test_filtered_sampling_frequencies_are_renormalised() -> None:
    samples = 30000
    rows = [row(top_p=0.7, temperature=1.0)] * samples  # keeps tokens 0, 1, 2 of PROBS
    logits = PROBS.log().expand(samples, -1).contiguous()
    counts = torch.bincount(torch.tensor(Sampler([EOS], seed=0)(logits, rows).token_ids)).double()
    kept = PROBS[:3].double()
    assert chi_square(counts, kept / kept.sum()) < CHI2_CRITICAL_DF2
