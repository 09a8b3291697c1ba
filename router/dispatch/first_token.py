"""The prefill's first token, streamed the moment the prefill returns (its TTFT).

The decode replica emits that token again as its first, with everything after it; the router
drops the repeat. Only without stop strings: then both sides' detokenizers send a token's text as
soon as it is whole, so the repeat's text is exactly the prefill's. With stop strings the decode
side must decide how much text is safe to send, so its stream goes out as it is.
"""

from dataclasses import replace

from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams


def streams_early(params: SamplingParams) -> bool:
    return not params.stop


def as_first_chunk(prefill_output: RequestOutput) -> RequestOutput:
    """The prefill's one-token output as the stream's first chunk: not finished (the prefill ran
    with max_tokens=1; the request goes on), no final metrics."""
    completion = replace(prefill_output.outputs[0], finish_reason=None, stop_reason=None)
    return replace(prefill_output, outputs=[completion], finished=False, metrics=None)


def without_first_token(chunk: RequestOutput, first: RequestOutput) -> RequestOutput | None:
    """The decode stream's first chunk minus the token already sent; None if nothing is left."""
    completion = chunk.outputs[0]
    sent_text = first.outputs[0].text
    if not completion.text.startswith(sent_text):
        raise RuntimeError(
            f"{chunk.request_id}: the decode side's first token text {completion.text!r} does "
            f"not start with the prefill's {sent_text!r}"
        )
    rest = replace(
        completion,
        token_ids=completion.token_ids[1:],
        text=completion.text[len(sent_text) :],
        logprobs=completion.logprobs[1:] if completion.logprobs else completion.logprobs,
    )
    if not rest.token_ids and not chunk.finished:
        return None
    return replace(chunk, outputs=[rest])
