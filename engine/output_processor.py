"""Turns sampled tokens into text; decides when a request stops (EOS, stop ids/strings, length)."""

from dataclasses import dataclass

from pdserve.engine.detokenizer import IncrementalDetokenizer
from pdserve.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.sampler import TokenLogprobs
from pdserve.engine.tokenizer import Tokenizer


@dataclass
class _State:
    detokenizer: IncrementalDetokenizer
    sent_chars: int = 0  # text already handed out; held-back text may still become a stop string


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: set[int], max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._states: dict[str, _State] = {}

    def add(self, request: Request) -> None:
        detok = IncrementalDetokenizer(
            self.tokenizer,
            request.prompt_token_ids,
            skip_special_tokens=request.sampling_params.skip_special_tokens,
        )
        self._states[request.request_id] = _State(detok)

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def append_token(
        self, request: Request, token_id: int, logprobs: TokenLogprobs | None
    ) -> tuple[RequestOutput, RequestStatus | None]:
        """Adds one sampled token; returns the delta to emit and the finish status, if any."""
        state = self._states[request.request_id]
        request.output_token_ids.append(token_id)
        prev_len = len(state.detokenizer.text)
        state.detokenizer.add_token(token_id)
        status, text = self._check_stop(request, token_id, state.detokenizer.text, prev_len)
        params = request.sampling_params
        # Hold back a tail that could still grow into a stop string, so it is never streamed out.
        hold = 0 if status is not None else max((len(s) - 1 for s in params.stop), default=0)
        new_text = text[state.sent_chars : max(state.sent_chars, len(text) - hold)]
        state.sent_chars += len(new_text)
        completion = CompletionOutput(
            index=0,
            text=new_text,
            token_ids=[token_id],
            logprobs=None if logprobs is None else [self._position_logprobs(logprobs)],
            finish_reason=None if status is None else status.value,
            stop_reason=request.stop_reason,
        )
        delta = RequestOutput.delta(request, completion)
        if status is not None:
            self.remove(request.request_id)
        return delta, status

    def _check_stop(
        self, request: Request, token_id: int, text: str, prev_len: int
    ) -> tuple[RequestStatus | None, str]:
        params = request.sampling_params
        num_out = len(request.output_token_ids)
        if num_out >= params.min_tokens:
            if not params.ignore_eos and token_id in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED, text
            if token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED, text
            for stop in params.stop:
                # Only a match that the newest text completes can be new.
                at = text.find(stop, max(0, prev_len - len(stop) + 1))
                if at != -1:
                    request.stop_reason = stop
                    end = at + len(stop) if params.include_stop_str_in_output else at
                    return RequestStatus.FINISHED_STOPPED, text[:end]
        if num_out >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH, text
        return None, text

    def _position_logprobs(self, lp: TokenLogprobs) -> PositionLogprobs:
        entries = {lp.token_id: (lp.logprob, lp.rank)}
        for rank, (tid, value) in enumerate(lp.top, start=1):
            entries.setdefault(tid, (value, rank))
        return {
            tid: Logprob(value, rank, self.tokenizer.decode([tid], skip_special_tokens=False))
            for tid, (value, rank) in entries.items()
        }
