"""The prefill's first token goes out at once; the decode stream's repeat of it is dropped."""

from pdserve.engine.outputs import CompletionOutput, Logprob, RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.dispatch.first_token import as_first_chunk, streams_early, without_first_token


def _output(text: str, token_ids: list[int], finish: str | None = None) -> RequestOutput:
    logprobs = [{t: Logprob(-1.0, 1, str(t))} for t in token_ids]
    completion = CompletionOutput(0, text, token_ids, logprobs, finish_reason=finish)
    return RequestOutput("r", None, [1, 2, 3], [completion], finished=finish is not None)


def test_first_chunk_is_the_prefill_token_not_finished() -> None:
    first = as_first_chunk(_output(" Hel", [7], finish="length"))
    assert first.outputs[0].token_ids == [7] and first.outputs[0].text == " Hel"
    assert not first.finished and first.outputs[0].finish_reason is None


def test_the_repeat_is_dropped_from_a_merged_chunk() -> None:
    rest = without_first_token(_output(" Hello there", [7, 8, 9]), _output(" Hel", [7]))
    completion = rest.outputs[0]
    assert completion.token_ids == [8, 9] and completion.text == "lo there"
    assert [list(p) for p in completion.logprobs] == [[8], [9]]


def test_a_chunk_of_only_the_repeat_is_skipped_unless_it_ends_the_stream() -> None:
    first = _output(" Hel", [7])
    assert without_first_token(_output(" Hel", [7]), first) is None
    last = without_first_token(_output(" Hel", [7], finish="stop"), first)
    assert last.finished and last.outputs[0].token_ids == []


def test_stop_strings_keep_the_decode_stream_as_it_is() -> None:
    assert streams_early(SamplingParams())
    assert not streams_early(SamplingParams(stop=["\n"]))
