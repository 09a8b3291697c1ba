"""Logits processors of the sampler: penalties, and the min-p, top-k and top-p filters.

Formulas follow vLLM v1. Each works on a [R, V] float32 batch of logits rows, one per request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pdserve.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pdserve.engine.sampler import SamplingRow

# Top-p looks for its cut among this many best tokens first (a top-k, far cheaper than sorting the
# vocab on CPU), then among GROWTH times as many for the rows where it lay beyond, and so on.
TOP_P_CANDIDATES = 1024
TOP_P_CANDIDATES_GROWTH = 8


def per_row(values: list[float], device: torch.device) -> Tensor:
    # [R]; index it [:, None] to broadcast over the vocab
    return torch.tensor(values, dtype=torch.float32, device=device)


def flat_ids(
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
        ids = flat_ids(repeated * 2, token_lists, vocab, device)
        factor = per_row([r.params.repetition_penalty for r in rows], device)[ids // vocab]
        # Repeated ids all write the same value (computed from the old one), so this is exact.
        values = flat[ids]
        flat[ids] = torch.where(values > 0, values / factor, values * factor)
    additive = [
        i for i, r in enumerate(rows) if r.params.frequency_penalty or r.params.presence_penalty
    ]
    if additive:
        outputs = [rows[i].output_token_ids for i in additive]
        ids, counts = flat_ids(additive, outputs, vocab, device).unique(return_counts=True)
        frequency = per_row([r.params.frequency_penalty for r in rows], device)[ids // vocab]
        presence = per_row([r.params.presence_penalty for r in rows], device)[ids // vocab]
        flat.index_add_(0, ids, -(frequency * counts + presence))


def on_rows(
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


def apply_min_p(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Masks in place tokens with prob < min_p * max_prob, as logit < max_logit + log(min_p)."""
    min_p = per_row([p.min_p for p in params], logits.device)[:, None]
    return logits.masked_fill_(logits < logits.amax(dim=-1, keepdim=True) + min_p.log(), -torch.inf)


def apply_top_k(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Masks in place every logit below its row's k-th best; ties with the k-th stay (as vLLM)."""
    top_k = [min(p.top_k, logits.shape[1]) for p in params]
    k = torch.tensor(top_k, device=logits.device).unsqueeze(1)
    kth = logits.topk(max(top_k), dim=-1).values.gather(1, k - 1)
    return logits.masked_fill_(logits < kth, -torch.inf)


def apply_top_k_top_p(
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
    p = per_row([q.top_p for q in params], device)[:, None]
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
        out[redo] = apply_top_k_top_p(logits[redo], [params[i] for i in redo], more)
    return out
