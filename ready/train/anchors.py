"""Anchor sampling in the target-generated part of training sequences.

Indexing (shared with the drafter, see docs/interfaces.md and ready/drafter): anchor `a` is
the index of the last committed token; draft position j = 1..K predicts token a+j; the
drafter's context is tokens[:a]; the reader reads the GDN state after token a-1.

Labels must be the target's own tokens: `trainable` marks them (the response part of a
regenerated prompt, or the assistant turns of a rendered conversation, `RegenData.trainable`).
An anchor is valid when its first label a+1 is trainable (and a >= 1: the reader reads the state
after token a-1); later labels a+j that are not trainable (past the end, a user turn) are masked
out, so blocks near a turn's end still train their early positions.
"""

from __future__ import annotations

import torch


def valid_anchors(trainable: torch.Tensor) -> torch.Tensor:
    """BoolTensor [B, T]: positions a whose next token a+1 is trainable (a >= 1)."""
    ok = torch.zeros_like(trainable, dtype=torch.bool)
    ok[:, :-1] = trainable[:, 1:].bool()
    ok[:, 0] = False
    return ok


def first_anchor(trainable: torch.Tensor) -> int:
    """The lowest valid anchor of any row (1 when there is none): where teacher passes must start."""
    cols = valid_anchors(trainable).any(0).nonzero().flatten()
    return int(cols[0]) if cols.numel() else 1


def sample_anchors(
    trainable: torch.Tensor,
    proposals: int,
    num_anchors: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw `num_anchors` distinct anchors per sequence, uniformly over its valid positions.

    trainable: BoolTensor [B, T] (`RegenData.trainable`). Returns anchors LongTensor [B, A] (sorted)
    and a label mask BoolTensor [B, A, K] (False where label a+j is not trainable, and for every
    position of a padding anchor when a sequence has fewer than A candidates). Deterministic given
    the generator's state (resumed training replays the same draws).
    """
    trainable = trainable.bool().cpu()
    B, T = trainable.shape
    A, K = int(num_anchors), int(proposals)
    valid = valid_anchors(trainable)
    cols = valid.any(0).nonzero().flatten()
    if cols.numel() == 0:
        return torch.ones(B, A, dtype=torch.long), torch.zeros(B, A, K, dtype=torch.bool)
    lo, hi = int(cols[0]), int(cols[-1])
    cand = lo + torch.arange(hi - lo + 1)  # [span]: the candidates of the whole batch
    ok = valid[:, lo:hi + 1]  # [B, span]
    keys = torch.rand(B, cand.numel(), generator=generator)
    keys = keys.masked_fill(~ok, 2.0)  # invalid candidates sort last
    take = min(A, cand.numel())
    order = keys.argsort(dim=1)[:, :take]
    anchors = cand[order]  # [B, take]
    kept = torch.gather(ok, 1, order)  # [B, take]
    if take < A:  # pad with copies of the first anchor, masked out
        anchors = torch.cat([anchors, anchors[:, :1].expand(B, A - take)], 1)
        kept = torch.cat([kept, torch.zeros(B, A - take, dtype=torch.bool)], 1)
    anchors = torch.where(kept, anchors, torch.full_like(anchors, lo))
    anchors, perm = anchors.sort(dim=1)
    kept = torch.gather(kept, 1, perm)
    label_pos = anchors.unsqueeze(-1) + torch.arange(1, K + 1)  # [B, A, K]
    padded = torch.cat([trainable, torch.zeros(B, K, dtype=torch.bool)], 1)
    mask = torch.gather(padded, 1, label_pos.view(B, A * K)).view(B, A, K) & kept.unsqueeze(-1)
    return anchors, mask


def gather_blocks(x: torch.Tensor, anchors: torch.Tensor, proposals: int, offset: int) -> torch.Tensor:
    """x[b, a + offset + j - 1] for j = 1..K, clamped to the sequence: [B, T, ...] -> [B, A, K, ...].

    offset 1 gives the labels tokens[a+1 .. a+K]; offset 0 gives the target logits that
    predict them (position a+j-1). Out-of-range indices are clamped; mask them.
    """
    B, T = x.shape[:2]
    pos = anchors.to(x.device).unsqueeze(-1) + offset + torch.arange(proposals, device=x.device)  # [B, A, K]
    pos = pos.clamp(0, T - 1)
    A = anchors.shape[1]
    rows = torch.arange(B, device=x.device).unsqueeze(1)
    return x[rows, pos.reshape(B, A * proposals)].view(B, A, proposals, *x.shape[2:])
