"""Streams ``/v1/completions`` and ``/v1/chat/completions`` from any OpenAI-compatible server over
aiohttp, ticking a ``TokenClock`` per chunk. aiohttp, not the ``openai`` SDK (a dev extra), so
the benchmarks run after ``pip install .``; it comes with ``ray[serve]``, and vLLM's bench uses it.

Each chunk's tokens are counted from its logprobs (asked for: one entry per token, so a chunk of
several tokens counts as several); a chunk with text but no logprobs counts as one token, as
vLLM's bench assumes of every chunk.
"""

import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import aiohttp

from pdserve.benchmarks.latency import TokenClock

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
MODELS = "/v1/models"
REQUEST_TIMEOUT_S = 600.0  # one request, its whole stream included
SSE_DATA = "data:"
SSE_DONE = "[DONE]"
# An exact output length (no stop at EOS), and logprob tokens as "token_id:<id>" so that a token
# whose text is empty or partial still has an entry; vLLM accepts both fields too.
EXACT_OUTPUT = {"ignore_eos": True, "return_tokens_as_token_ids": True}
INCLUDE_USAGE = {"include_usage": True}


class Usage(NamedTuple):
    """The stream's last ``usage``; None where the server sent none."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None  # prompt tokens the server found in its prefix cache


NO_USAGE = Usage(None, None, None)


class OpenAIError(RuntimeError):
    """A refusal: an HTTP error ``status``, or an error event in the stream (``status`` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def completion_body(
    model: str | None, prompt: str | list[int], max_tokens: int, exact: bool = True
) -> dict[str, Any]:
    """A greedy streamed completion that asks for each token's logprob and the usage."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "logprobs": 0}
    return _streamed(body, exact)


def chat_body(
    model: str | None, messages: list[dict[str, str]], max_tokens: int, exact: bool = True
) -> dict[str, Any]:
    """A greedy streamed chat completion that asks for each token's logprob and the usage."""
    body = {"model": model, "messages": messages, "max_completion_tokens": max_tokens}
    return _streamed(body | {"logprobs": True, "top_logprobs": 0}, exact)


def _streamed(body: dict[str, Any], exact: bool) -> dict[str, Any]:
    body |= {"temperature": 0.0, "stream": True, "stream_options": INCLUDE_USAGE}
    return body | EXACT_OUTPUT if exact else body


def token_ids(tokens: list[str]) -> list[int]:
    """The ids in logprob tokens of a request made with ``return_tokens_as_token_ids``."""
    return [int(token.removeprefix("token_id:")) for token in tokens]


def chunk_tokens(choice: dict[str, Any]) -> int:
    """How many tokens one streamed choice carries."""
    logprobs = choice.get("logprobs")
    if logprobs:  # completions: parallel lists ("tokens", ...); chat: one "content" per token
        return len(logprobs.get("tokens") or logprobs.get("content") or [])
    text = choice.get("text") or (choice.get("delta") or {}).get("content")
    return 1 if text else 0


class OpenAIClient:
    """One aiohttp session to the server at ``url`` (e.g. ``http://127.0.0.1:8000``, no /v1);
    use as ``async with``."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        keep_alive: bool = True,
    ) -> None:
        """``keep_alive=False``: a new connection per request, for a server that closes idle
        kept-alive ones on its own terms (llama.cpp's, after 5 s), which the client finds only when
        it writes its next request on one."""
        self.url = url.rstrip("/")
        self.headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.timeout_s = timeout_s
        self.keep_alive = keep_alive
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "OpenAIClient":
        # limit=0: no cap on open connections, which would quietly cap the benchmark's concurrency
        self.session = aiohttp.ClientSession(
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=0, force_close=not self.keep_alive),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._open().close()

    def _open(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("use OpenAIClient as `async with OpenAIClient(url) as client`")
        return self.session

    async def models(self) -> list[str]:
        """The served models' ids, in the server's order."""
        async with self._open().get(self.url + MODELS) as response:
            await _check(response)
            return [model["id"] for model in (await response.json())["data"]]

    async def events(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks as JSON, until ``[DONE]``."""
        async with self._open().post(self.url + path, json=body) as response:
            await _check(response)
            async for raw in response.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith(SSE_DATA):  # blank separators and ": comments"
                    continue
                data = line.removeprefix(SSE_DATA).strip()
                if data == SSE_DONE:
                    return
                event = json.loads(data)
                if "error" in event:
                    raise OpenAIError(event["error"].get("message", data))
                yield event

    async def stream(self, path: str, body: dict[str, Any], clock: TokenClock) -> Usage:
        """Sends ``body`` to ``path``, ticking ``clock`` at each chunk's tokens."""
        usage = NO_USAGE
        async for event in self.events(path, body):
            for choice in event.get("choices") or []:
                clock.tick(chunk_tokens(choice))
            if event.get("usage"):
                usage = _usage(event["usage"])
        return usage


def _usage(usage: dict[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        usage.get("prompt_tokens"), usage.get("completion_tokens"), details.get("cached_tokens")
    )


async def _check(response: aiohttp.ClientResponse) -> None:
    if response.status == 200:
        return
    text = await response.text()
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text
    raise OpenAIError(f"HTTP {response.status}: {message}", response.status)
