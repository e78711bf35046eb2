"""Teacher-forced acceptance: the engine's greedy acceptance, computed for every anchor at once.

On target-regenerated sequences the tokens after the prompt are the target's own greedy choices,
so they are exactly what verification would accept. For an anchor a (the last committed token)
the drafter's K drafts are its argmaxes at positions a+1..a+K; the accepted length is the longest
prefix of them equal to the sequence's tokens, and the round would commit A + 1 tokens. The
drafter's training forward teacher-forces its sequence head on the true tokens, which along the
accepted prefix are the drafts themselves, so the first mismatch (and so A) is the same as in the
engine. One target forward and one drafter forward score every anchor of a batch of sequences:
thousands of blocks in seconds, with no decoding-loop noise. Only anchors with a full block of K
true tokens after them count (no censoring), and only those are computed: each batch's rows carry
their own full-block anchors (`compact_anchors`), not the span of every row's, which on chat data
(assistant turns at different places) is mostly other rows' anchors.

`tau` = sum over blocks of (A + 1) / blocks, per sequence tallies kept for paired resampling
(`reports.stats`).
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from ready.train.anchors import valid_anchors
from ready.train.regen import RegenData
from ready.train.teacher_pass import teacher_pass


def full_block_anchors(data: RegenData, proposals: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors [N, A] (every a whose labels a+1 .. a+K are all target-generated tokens) and their
    validity mask."""
    trainable = data.trainable()
    N, T = trainable.shape
    padded = torch.cat([trainable, torch.zeros(N, proposals, dtype=torch.bool)], 1)
    full = valid_anchors(trainable)
    for j in range(2, proposals + 1):  # every label of the block, not only the first
        full[:, : T] &= padded[:, j: j + T]
    cols = full.any(0).nonzero().flatten() if N else torch.zeros(0, dtype=torch.long)
    if cols.numel() == 0:
        return torch.ones(N, 0, dtype=torch.long), torch.zeros(N, 0, dtype=torch.bool)
    lo, hi = int(cols[0]), int(cols[-1])
    anchors = lo + torch.arange(hi - lo + 1).expand(N, hi - lo + 1)
    return anchors, full[:, lo: hi + 1]


def compact_anchors(anchors: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's valid anchors first, in order, cut to the batch's largest count: [B, A] -> [B, A'].

    Blocks are independent (each sees its context and itself), so dropping invalid anchors changes no
    valid block's acceptance. Padding slots repeat the row's first anchor and are marked invalid."""
    keep = max(int(valid.sum(1).max()), 1) if valid.numel() else 0
    order = torch.argsort((~valid).to(torch.uint8), dim=1, stable=True)[:, :keep]
    a, ok = anchors.gather(1, order), valid.gather(1, order)
    return torch.where(ok, a, a[:, :1]), ok


@torch.no_grad()
def block_acceptance(drafter: Any, target: Any, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Accepted draft length A [B, A] at each anchor of `tokens` [B, T] (target-greedy after the prompt)."""
    K = int(drafter.proposals)
    tp = teacher_pass(target, drafter, tokens, anchors, logits=False)  # every drafting row asks the same
    logits = drafter.forward_train(tokens, tp.hidden, anchors, tp.states)  # [B, A, K, V]
    T = tokens.shape[1]
    pos = (anchors.unsqueeze(-1) + torch.arange(1, K + 1, device=tokens.device)).clamp(max=T - 1)
    labels = tokens.gather(1, pos.flatten(1)).view_as(pos)
    match = (logits.argmax(-1) == labels).int()
    return match.cumprod(-1).sum(-1)


def _batches(n: int, size: int) -> list[slice]:
    """Row slices of at most `size`, never a lone last row (the state placebo pairs rows)."""
    cuts = list(range(0, n, size)) + [n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:])]


@torch.no_grad()
def teacher_forced_acceptance(drafter: Any, target: Any, data: RegenData, batch_size: int = 8,
                              progress: bool = True, split: str = "validation") -> dict[str, Any]:
    """Per-sequence tallies and the pooled tau over every full-block anchor of `data` (JSON-able)."""
    K = int(drafter.proposals)
    device = next(drafter.parameters()).device
    anchors, valid = full_block_anchors(data, K)
    committed, blocks = [], []
    was_training = drafter.training
    drafter.eval()
    bar = tqdm(total=len(data), desc="teacher-forced acceptance", unit="seq", disable=not progress, leave=False)
    for rows in _batches(len(data), max(2, batch_size)):
        a, ok = compact_anchors(anchors[rows], valid[rows])
        tokens, a, ok = data.tokens[rows].to(device), a.to(device), ok.to(device)
        if not bool(ok.any()):
            committed += [0] * tokens.shape[0]
            blocks += [0] * tokens.shape[0]
        else:
            acc = block_acceptance(drafter, target, tokens, a)
            committed += ((acc + 1) * ok).sum(1).tolist()
            blocks += ok.sum(1).tolist()
        bar.update(tokens.shape[0])
    bar.close()
    drafter.train(was_training)
    total = sum(blocks)
    return {"split": split, "proposals": K, "num_sequences": len(data),
            "sequences": {"committed": [int(c) for c in committed], "blocks": [int(b) for b in blocks]},
            "tau": sum(committed) / total if total else None}
