"""The engine's per-token logprobs in OpenAI's two formats (legacy completions, and chat)."""

from collections.abc import Sequence

from pdserve.engine.outputs import Logprob, PositionLogprobs
from pdserve.router.api.openai_responses import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprob,
    TopLogprob,
)


def _token(token_id: int, logprob: Logprob, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else logprob.decoded_token


def completion_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    text_offset: int,
    as_ids: bool = False,
) -> CompletionLogprobs:
    """``text_offset``: characters of the choice's text before these tokens (vLLM's convention:
    offsets advance by each token's own decoded length)."""
    result = CompletionLogprobs()
    for token_id, position in zip(token_ids, positions, strict=True):
        token = _token(token_id, position[token_id], as_ids)
        result.tokens.append(token)
        result.token_logprobs.append(position[token_id].logprob)
        # The sampled token and the top ones, as the engine returned them.
        top = {_token(t, lp, as_ids): lp.logprob for t, lp in position.items()}
        result.top_logprobs.append(top)
        result.text_offset.append(text_offset)
        text_offset += len(token)
    return result


def _top(token_id: int, logprob: Logprob, as_ids: bool) -> TopLogprob:
    token = _token(token_id, logprob, as_ids)
    return TopLogprob(token=token, logprob=logprob.logprob, bytes=list(token.encode()))


def chat_logprobs(
    token_ids: Sequence[int],
    positions: Sequence[PositionLogprobs],
    num_top: int,
    as_ids: bool = False,
) -> ChatLogprobs:
    content = []
    for token_id, position in zip(token_ids, positions, strict=True):
        sampled = _top(token_id, position[token_id], as_ids)
        ranked = sorted(position.items(), key=lambda item: item[1].rank)
        top = [_top(t, lp, as_ids) for t, lp in ranked if lp.rank <= num_top]
        content.append(TokenLogprob(**sampled.model_dump(), top_logprobs=top))
    return ChatLogprobs(content=content)
