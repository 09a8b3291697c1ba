"""What the engine hands back: per-step deltas that add up to a finished request's output."""

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # request.py imports RequestMetrics from here
    from pdserve.engine.request import Request


class Logprob(NamedTuple):
    logprob: float
    rank: int  # 1 = most likely token
    decoded_token: str


# One generated position: token id -> its logprob (the sampled token plus the top-N).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it

    def add(self, delta: "CompletionOutput") -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason


@dataclass(frozen=True)
class RequestMetrics:
    """A finished request's timings, in time.monotonic() seconds."""

    arrival_time: float
    first_token_time: float | None
    finished_time: float | None
    token_times: tuple[float, ...]  # when each output token was produced
    num_cached_tokens: int


@dataclass
class RequestOutput:
    """A request's output. ``LLMEngine.step`` returns deltas (new tokens); ``add`` joins them."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # outputs[i].index == i
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None  # set on the final delta
    # Prefill role: what a peer needs to read the finished request's held KV (vLLM's name).
    kv_transfer_params: Any = None

    @classmethod
    def delta(
        cls, request: "Request", completion: CompletionOutput, metrics: RequestMetrics | None = None
    ) -> "RequestOutput":
        """One step's output of ``request``; finished when ``completion`` has a finish reason."""
        return cls(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            [completion],
            finished=completion.finish_reason is not None,
            num_cached_tokens=request.num_cached_tokens,
            metrics=metrics,
        )

    def without_prompt(self) -> "RequestOutput":
        """This output for the wire: the prompt stays behind, as its sender has it already."""
        return dataclasses.replace(self, prompt=None, prompt_token_ids=[])

    def add(self, delta: "RequestOutput") -> None:
        """Joins a later delta: each of its completions into the one with the same index."""
        for new in delta.outputs:
            self.outputs[new.index].add(new)
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        self.metrics = delta.metrics or self.metrics

    # The single-completion view most callers want (n == 1).
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[PositionLogprobs] | None:
        return self.outputs[0].logprobs
