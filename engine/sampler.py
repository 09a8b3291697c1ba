"""Batched sampler: penalties, temperature, min-p, top-k/top-p, seeded sampling, raw logprobs.

Order and formulas follow vLLM v1: min_tokens masking and penalties on the raw logits; greedy rows
take the argmax of those; random rows are divided by their temperature, filtered by min-p, then
top-k and top-p, and sampled. Logprobs are the log-softmax of the raw logits (vLLM's default).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from pdserve.engine.sampling_params import SamplingParams

# Top-p looks for its cut among this many best tokens first (a top-k, far cheaper than sorting the
# vocab on CPU), then among GROWTH times as many for the rows where it lay beyond, and so on.
TOP_P_CANDIDATES = 1024
TOP_P_CANDIDATES_GROWTH = 8


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
    return torch.Generator(device=device).manual_seed(params.seed)


def _per_row(values: list[float], device: torch.device) -> Tensor:
    # [R]; index it [:, None] to broadcast over the vocab
    return torch.tensor(values, dtype=torch.float32, device=device)


def _flat_ids(
    rows: list[int], token_lists: list[Sequence[int]], vocab: int, device: torch.device
) -> Tensor:
    """[N] indices row * V + token into logits.view(-1), one per token of token_lists[j]."""
    lengths = torch.tensor([len(toks) for toks in token_lists], device=device)
    tokens = torch.tensor(
        [t for toks in token_lists for t in toks], dtype=torch.long, device=device
    )
    return torch.tensor(rows, device=device).repeat_interleave(lengths) * vocab + tokens


def apply_penalties(logits: Tensor, rows: Sequence[SamplingRow]) -> None:
    """vLLM's penalties, in place on logits: [R, V] contiguous, row r for rows[r].

    Repetition (prompt and output tokens): positive logits / r, negative ones * r.
    Frequency and presence (output tokens only): logit -= f * count + p * (count > 0).
    Only the seen (row, token) entries are touched: O(tokens), not O(R * V).
    """
    vocab, device, flat = logits.shape[1], logits.device, logits.view(-1)
    repeated = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1]
    if repeated:
        token_lists = [rows[i].prompt_token_ids for i in repeated]
        token_lists += [rows[i].output_token_ids for i in repeated]
        ids = _flat_ids(repeated * 2, token_lists, vocab, device)
        factor = _per_row([r.params.repetition_penalty for r in rows], device)[ids // vocab]
        # Repeated ids all write the same value (computed from the old one), so this is exact.
        values = flat[ids]
        flat[ids] = torch.where(values > 0, values / factor, values * factor)
    additive = [
        i for i, r in enumerate(rows) if r.params.frequency_penalty or r.params.presence_penalty
    ]
    if additive:
        outputs = [rows[i].output_token_ids for i in additive]
        ids, counts = _flat_ids(additive, outputs, vocab, device).unique(return_counts=True)
        frequency = _per_row([r.params.frequency_penalty for r in rows], device)[ids // vocab]
        presence = _per_row([r.params.presence_penalty for r in rows], device)[ids // vocab]
        flat.index_add_(0, ids, -(frequency * counts + presence))


def _on_rows(
    logits: Tensor,
    params: list[SamplingParams],
    wanted: Callable[[SamplingParams], bool],
    fn: Callable[[Tensor, list[SamplingParams]], Tensor],
) -> Tensor:
    """Applies fn (may work in place) to the rows of logits [R, V] whose params are `wanted`."""
    selected = [i for i, p in enumerate(params) if wanted(p)]
    if len(selected) == len(params):
        return fn(logits, params)  # every row: skip the gather/scatter copies
    if selected:
        logits[selected] = fn(logits[selected], [params[i] for i in selected])
    return logits


def _min_p(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Masks in place tokens with prob < min_p * max_prob, as logit < max_logit + log(min_p)."""
    min_p = _per_row([p.min_p for p in params], logits.device)[:, None]
    return logits.masked_fill_(logits < logits.amax(dim=-1, keepdim=True) + min_p.log(), -torch.inf)


def _top_k(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Masks in place every logit below its row's k-th best; ties with the k-th stay (as vLLM)."""
    top_k = [min(p.top_k, logits.shape[1]) for p in params]
    k = torch.tensor(top_k, device=logits.device).unsqueeze(1)
    kth = logits.topk(max(top_k), dim=-1).values.gather(1, k - 1)
    return logits.masked_fill_(logits < kth, -torch.inf)


def _top_k_top_p(
    logits: Tensor, params: list[SamplingParams], candidates: int = TOP_P_CANDIDATES
) -> Tensor:
    """Top-k, then top-p on the mass renormalised over the top-k (vLLM); logits: [R, V].

    The cut is looked for among the `candidates` best tokens; rows whose cut lies beyond them
    are redone with more (candidates >= V: a full sort, which always resolves).
    """
    vocab, device = logits.shape[1], logits.device
    candidates = min(vocab, candidates)
    k = [min(q.top_k, vocab) if q.top_k_enabled else vocab for q in params]
    k = torch.tensor(k, device=device)[:, None]  # [R, 1]
    p = _per_row([q.top_p for q in params], device)[:, None]
    values, ids = logits.topk(candidates, dim=-1)  # [R, C], best first
    # Ties with the k-th stay (as vLLM); past the candidates the last one is the bar, a no-op.
    values.masked_fill_(values < values.gather(1, k.clamp(max=candidates) - 1), -torch.inf)
    probs = logits.softmax(dim=-1).gather(1, ids).masked_fill_(values == -torch.inf, 0.0)
    top_k_inside = k <= candidates
    probs = torch.where(top_k_inside, probs / probs.sum(dim=-1, keepdim=True), probs)
    # Cut a token once the mass strictly before it reaches p: the best token always stays.
    mass = probs.cumsum(dim=-1)
    values.masked_fill_(mass - probs >= p, -torch.inf)
    # Exact where the top-k cut is inside the candidates, or (no top-k) the candidates reach p.
    resolved = (top_k_inside | ((k == vocab) & (mass[:, -1:] >= p))).squeeze(1)
    out = torch.full_like(logits, -torch.inf).scatter_(1, ids, values)
    redo = (~resolved).nonzero().squeeze(1).tolist()
    if redo:
        more = candidates * TOP_P_CANDIDATES_GROWTH
        out[redo] = _top_k_top_p(logits[redo], [params[i] for i in redo], more)
    return out


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
            ids = _flat_ids([i for i, _ in suppress], stop_ids, logits.shape[1], logits.device)
            logits.view(-1)[ids] = -torch.inf
        return logits

    def _stop_ids(self, row: SamplingRow, vocab: int) -> list[int]:
        """Ids that would end the request: its stop_token_ids, plus EOS unless ignore_eos."""
        eos = () if row.params.ignore_eos else self.eos_token_ids
        return [t for t in (*row.params.stop_token_ids, *eos) if t < vocab]

    def _sample(self, logits: Tensor, rows: list[SamplingRow], owned: bool) -> Tensor:
        """logits: [R, V] (modified in place only if `owned`); returns token ids [R]."""
        device, vocab = logits.device, logits.shape[1]
        temperature = _per_row([r.params.temperature for r in rows], device)[:, None]
        logits = logits.div_(temperature) if owned else logits / temperature
        params = [r.params for r in rows]
        logits = _on_rows(logits, params, lambda p: p.min_p > 0, _min_p)
        logits = _on_rows(logits, params, lambda p: p.top_k_enabled and p.top_p == 1, _top_k)
        logits = _on_rows(logits, params, lambda p: p.top_p < 1, _top_k_top_p)
        probs = logits.softmax(dim=-1)
        # argmax(probs / q) with q = -log(u) ~ Exp(1) is a draw from probs (the Gumbel-max trick;
        # uniform_ + log is ~3x cheaper than exponential_ on CPU). Seeded rows draw u from their
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
