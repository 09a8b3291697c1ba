import dataclasses

import pytest

from pdserve.engine.sampling_params import GREEDY_EPS, MAX_LOGPROBS, MAX_N, SamplingParams


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (
        1,
        16,
        1.0,
        1.0,
        0,
        0.0,
    )
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.seed is None and p.logprobs is None and p.min_tokens == 0
    assert p.stop == () and p.stop_token_ids == ()
    assert not p.ignore_eos and p.skip_special_tokens and not p.include_stop_str_in_output
    assert not p.greedy and not p.uses_penalties


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("n", MAX_N + 1),
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("temperature", -1),
        ("top_p", 0),
        ("top_p", 2),
        ("top_p", -0.5),
        ("top_k", -2),
        ("top_k", 1.5),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("presence_penalty", 2.5),
        ("presence_penalty", -3),
        ("frequency_penalty", 2.01),
        ("frequency_penalty", -2.5),
        ("repetition_penalty", 0),
        ("repetition_penalty", -1),
        ("seed", 1.5),
        ("seed", "7"),
        ("seed", True),
        ("seed", 2**64),
        ("min_tokens", -1),
        ("logprobs", -1),
        ("logprobs", MAX_LOGPROBS + 1),
        ("stop", [""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_invalid_value_raises_naming_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{field} must be "), message
    # Sequences are stored (and reported) as tuples.
    shown = tuple(value) if isinstance(value, list) else value
    assert message.endswith(f", got {shown!r}"), message


def test_temperature_message_format() -> None:
    with pytest.raises(ValueError, match=r"^temperature must be >= 0, got -1$"):
        SamplingParams(temperature=-1)


def test_min_tokens_above_max_tokens_is_an_error() -> None:
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": -1},
        {"top_k": 0},
        {"top_k": 1},
        {"top_p": 1e-9},
        {"min_p": 1.0},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"repetition_penalty": 1e-3},
        {"logprobs": 0},
        {"logprobs": MAX_LOGPROBS},
        {"temperature": 0.0, "seed": 0},
        {"seed": -(2**63)},
        {"seed": 2**64 - 1},
        {"max_tokens": 1},
    ],
)
def test_boundary_values_are_accepted(kwargs: dict) -> None:
    SamplingParams(**kwargs)


def test_stop_is_normalised_to_a_tuple() -> None:
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop_token_ids=[5, 7]).stop_token_ids == (5, 7)


def test_frozen_and_hashable() -> None:
    p = SamplingParams(stop=["x"], stop_token_ids=[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert hash(p) == hash(SamplingParams(stop=("x",), stop_token_ids=(1,)))


def test_greedy_below_epsilon() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=GREEDY_EPS / 2).greedy
    assert not SamplingParams(temperature=GREEDY_EPS).greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_uses_penalties() -> None:
    assert SamplingParams(repetition_penalty=1.1).uses_penalties
    assert SamplingParams(presence_penalty=0.5).uses_penalties
    assert SamplingParams(frequency_penalty=-0.5).uses_penalties
