"""RequestGroup: prompts × n engine requests read as one stream of (choice, delta); token counts;
a refusal or a close aborts every request of the group (no engine needed: a scripted client)."""

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest

from pdserve.engine.errors import EngineOverloadedError
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.api.request_group import RequestGroup, start_group

TIMEOUT_S = 10.0
T = TypeVar("T")


class ScriptedClient:
    """Answers each request with ``num_tokens`` one-token deltas (token id = request number),
    reports ``cached`` cached tokens, refuses ids listed in ``refuse``, and records closings."""

    model_name = "scripted"
    max_model_len = 100
    tokenizer = None

    def __init__(self, num_tokens: int = 3, cached: int = 0, refuse: tuple[str, ...] = ()) -> None:
        self.num_tokens = num_tokens
        self.cached = cached
        self.refuse = refuse
        self.params: dict[str, SamplingParams] = {}
        self.closed_early: list[str] = []

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        self.params[request_id] = params
        if request_id in self.refuse:
            raise EngineOverloadedError("busy")
        finished = False
        try:
            for i in range(self.num_tokens):
                await asyncio.sleep(0)
                finished = i == self.num_tokens - 1
                completion = CompletionOutput(
                    0, f"t{i}", [len(self.params)], finish_reason="length" if finished else None
                )
                yield RequestOutput(
                    request_id, None, prompt_token_ids, [completion], finished, self.cached
                )
        finally:
            if not finished:
                self.closed_early.append(request_id)

    async def check_health(self) -> None:
        pass


async def _closed(client: ScriptedClient, num_streams: int) -> None:
    """Returns once ``num_streams`` streams were closed early (under ``_run``'s deadline)."""
    while len(client.closed_early) < num_streams:
        await asyncio.sleep(0)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


async def _read_all(group: RequestGroup) -> list[tuple[int, RequestOutput]]:
    return [event async for event in group]


def test_choices_are_prompt_major_and_accumulate() -> None:
    client = ScriptedClient(num_tokens=3, cached=4)

    async def main() -> tuple[RequestGroup, list[tuple[int, RequestOutput]]]:
        params = SamplingParams(n=2, seed=10)
        group = await start_group(client, "req", [[1, 2], [3, 4, 5]], params)
        return group, await _read_all(group)

    group, events = _run(main())
    assert sorted({index for index, _ in events}) == [0, 1, 2, 3]
    assert sorted(client.params) == ["req-0", "req-1", "req-2", "req-3"]
    # fan_out: n=1 children with distinct seeds, the same for each prompt.
    assert [client.params[f"req-{i}"].seed for i in range(4)] == [10, 11, 10, 11]
    assert all(p.n == 1 for p in client.params.values())
    assert [o.prompt_token_ids for o in group.outputs] == [[1, 2], [1, 2], [3, 4, 5], [3, 4, 5]]
    assert all(o.text == "t0t1t2" and o.finished for o in group.outputs)
    assert group.token_counts() == (5, 12, 8)  # prompts once each; cached: each prompt's first
    assert not client.closed_early


def test_a_refusal_raises_and_aborts_the_rest() -> None:
    client = ScriptedClient(num_tokens=50, refuse=("req-1",))

    async def main() -> None:
        with pytest.raises(EngineOverloadedError):
            await start_group(client, "req", [[1]], SamplingParams(n=3))
        await _closed(client, 2)  # the cancelled drains close their streams

    _run(main())
    assert sorted(client.closed_early) == ["req-0", "req-2"]


def test_close_aborts_unfinished_requests() -> None:
    client = ScriptedClient(num_tokens=50)

    async def main() -> None:
        group = await start_group(client, "req", [[1], [2]], SamplingParams())
        async for _ in group:
            break
        group.close()
        await _closed(client, 2)

    _run(main())
    assert sorted(client.closed_early) == ["req-0", "req-1"]
