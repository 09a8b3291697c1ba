"""bench quantization's figures, from continuations whose agreement is known."""

import pytest

from pdserve.benchmarks.quantization import agreement


def test_agreement_counts_identical_prefixes_and_forced_tokens() -> None:
    reference = [[1, 2, 3, 4], [5, 6, 7, 8]]
    continuations = [[1, 2, 3, 4], [5, 9, 9, 9]]
    next_tokens = [[1, 2, 3, 4], [5, 6, 0, 8]]  # the second diverged at 1, then followed again
    figures = agreement(reference, continuations, next_tokens)
    assert figures["identical"] == 0.5
    assert figures["tokens_before_divergence"] == (4 + 1) / 2
    assert figures["teacher_forced"] == pytest.approx(7 / 8)


def test_agreement_refuses_lists_of_other_lengths() -> None:
    with pytest.raises(ValueError):
        agreement([[1, 2]], [[1, 2]], [[1]])
