"""Batched sampler: penalties, temperature, min-p, top-k/top-p, seeded sampling, raw logprobs.

Order and formulas follow vLLM v1: min_tokens masking and penalties on the raw logits; greedy rows
take the argmax of those; random rows are divided by their temperature, filtered by min-p, then
top-k and top-p, and sampled. Logprobs are the log-softmax of the raw logits (vLLM's default).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from pdserve.engine.logits_processors import (
    apply_min_p,
    apply_penalties,
    apply_top_k,
    apply_top_k_top_p,
    flat_ids,
    on_rows,
    per_row,
)
from pdserve.engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """One request's state at this step (one row of the logits)."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None  # make_generator(), on the logits device, per request


class TokenLogprobs(NamedTuple):
    token_id: int
    logprob: float
    rank: int  # 1 = most likely; ties count against the token, as in vLLM
    top: list[tuple[int, float]]  # params.logprobs best (token_id, logprob), best first


class SamplerOutput(NamedTuple):
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # None where the request asked for no logprobs


def make_generator(params: SamplingParams, device: torch.device | str) -> torch.Generator | None:
    """The private RNG of a seeded request; make it once, on the logits' device."""
    if params.seed is None:
        return None
    return torch.Generator(device=device)


# A 64-bit odd constant (2^64 / golden ratio) that spreads seeds apart: the tokens of a request
# and the seed + i of n fanned-out completions never share a stream.
_SEED_STRIDE = 0x9E3779B97F4A7C15


def token_seed(seed: int, index: int) -> int:
    """The RNG seed of a seeded request's ``index``-th generated token, a function of the two
    alone: whichever engine samples that token (the prefill replica the first, a decode replica
    the rest) draws the same numbers."""
    return (seed * _SEED_STRIDE + index) % 2**64


class Sampler:
    """Picks one token per logits row; greedy-only batches cost one argmax."""

    def __init__(self, eos_token_ids: Sequence[int], seed: int | None = None) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        # The RNG seed of unseeded rows; a random one by default, kept to replay a run.
        self.seed = secrets.randbits(63) if seed is None else seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def __call__(self, logits: Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """logits: [B, V] float32, row i belongs to rows[i]; `logits` is not modified."""
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        random = [i for i, r in enumerate(rows) if not r.params.greedy]
        processed = self._suppress_and_penalise(logits, rows)
        if not random:
            tokens = processed.argmax(dim=-1)
        elif not greedy:
            tokens = self._sample(processed, list(rows), owned=processed is not logits)
        else:
            tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
            tokens[greedy] = processed[greedy].argmax(dim=-1)
            random_rows = [rows[i] for i in random]
            tokens[random] = self._sample(processed[random], random_rows, owned=True)
        return SamplerOutput(tokens.tolist(), self._logprobs(logits, tokens, rows))

    def _suppress_and_penalise(self, logits: Tensor, rows: Sequence[SamplingRow]) -> Tensor:
        """min_tokens masking and penalties; returns `logits` itself when no row needs either."""
        suppress = [
            (i, r) for i, r in enumerate(rows) if len(r.output_token_ids) < r.params.min_tokens
        ]
        penalised = any(r.params.uses_penalties for r in rows)
        if not suppress and not penalised:
            return logits
        logits = logits.clone()  # ours from here: penalties and masks work in place
        if penalised:
            apply_penalties(logits, rows)
        # Penalties keep -inf at -inf, so masking after them equals vLLM's masking before.
        if suppress:
            stop_ids = [self._stop_ids(r, logits.shape[1]) for _, r in suppress]
            ids = flat_ids([i for i, _ in suppress], stop_ids, logits.shape[1], logits.device)
            logits.view(-1)[ids] = -torch.inf
        return logits

    def _stop_ids(self, row: SamplingRow, vocab: int) -> list[int]:
        """Ids that would end the request: its stop_token_ids, plus EOS unless ignore_eos."""
        eos = () if row.params.ignore_eos else self.eos_token_ids
        return [t for t in (*row.params.stop_token_ids, *eos) if t < vocab]

    def _sample(self, logits: Tensor, rows: list[SamplingRow], owned: bool) -> Tensor:
        """logits: [R, V] (modified in place only if `owned`); returns token ids [R]."""
        device, vocab = logits.device, logits.shape[1]
        temperature = per_row([r.params.temperature for r in rows], device)[:, None]
        logits = logits.div_(temperature) if owned else logits / temperature
        params = [r.params for r in rows]
        logits = on_rows(logits, params, lambda p: p.min_p > 0, apply_min_p)
        logits = on_rows(logits, params, lambda p: p.top_k_enabled and p.top_p == 1, apply_top_k)
        logits = on_rows(logits, params, lambda p: p.top_p < 1, apply_top_k_top_p)
        probs = logits.softmax(dim=-1)
        # argmax(probs / q) with q = -log(u) ~ Exp(1) is a draw from probs (the Gumbel-max trick;
        # uniform_ + log is cheaper than exponential_ on CPU). Seeded rows draw u from their
        # own generator only, so their tokens do not depend on the rest of the batch.
        u = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(rows) if r.generator is None]
        if len(unseeded) == len(rows):
            u.uniform_(generator=self._generator(device))
        elif unseeded:  # draw only what the unseeded rows need
            gen = self._generator(device)
            u[unseeded] = torch.rand(len(unseeded), vocab, generator=gen, device=device)
        for i, r in enumerate(rows):
            if r.generator is not None:
                r.generator.manual_seed(token_seed(r.params.seed, len(r.output_token_ids)))
                u[i].uniform_(generator=r.generator)
        # log(u) < 0, so argmax(probs / -log u) = argmin(probs / log u), one pass fewer. u = 0
        # gives -0.0, which never beats a positive probability.
        return probs.div_(u.log_()).argmin(dim=-1)

    @staticmethod
    def _logprobs(
        logits: Tensor, tokens: Tensor, rows: Sequence[SamplingRow]
    ) -> list[TokenLogprobs | None]:
        """Raw logprobs (before penalties and temperature) for the rows that asked for them."""
        result: list[TokenLogprobs | None] = [None] * len(rows)
        want = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        if not want:
            return result
        logprobs = logits[want].float().log_softmax(dim=-1)  # [W, V]
        sampled_ids = tokens[want]
        sampled = logprobs.gather(1, sampled_ids.unsqueeze(1))  # [W, 1]
        ranks = (logprobs >= sampled).sum(dim=-1).tolist()
        num_top = max(rows[i].params.logprobs or 0 for i in want)
        top_values, top_ids = logprobs.topk(num_top, dim=-1)  # sorted, best first
        columns = (sampled_ids.tolist(), sampled.squeeze(1).tolist(), ranks)
        for i, token, logprob, rank, ids, values in zip(
            want, *columns, top_ids.tolist(), top_values.tolist(), strict=True
        ):
            n = rows[i].params.logprobs
            top = list(zip(ids[:n], values[:n], strict=True))
            result[i] = TokenLogprobs(token, logprob, rank, top)
        return result
