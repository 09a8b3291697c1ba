"""The chaos benchmark's greedy check: every completed stream's tokens against the offline
engine's greedy tokens for its prompt, run after the chaos on the same weights with no fault,
kill or other request in the way."""

from pathlib import Path

from pdserve.benchmarks.chaos_load import Outcome
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams


def greedy_differences(model: Path, outcomes: list[Outcome]) -> dict[str, int]:
    """How many completed streams were checked, and how many differ from the offline engine (the
    model at ``model``, its default engine config: serve it with the same)."""
    completed = [outcome for outcome in outcomes if outcome.ending == "completed"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=outcome.max_tokens, ignore_eos=True)
        for outcome in completed
    ]
    expected = LLM(model=str(model)).generate([o.prompt for o in completed], params)
    differ = sum(
        list(outcome.token_ids) != output.token_ids
        for outcome, output in zip(completed, expected, strict=True)
    )
    return {"checked": len(completed), "differ": differ}
