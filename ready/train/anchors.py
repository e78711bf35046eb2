"""Anchor sampling in the response part of target-regenerated sequences.

Indexing (shared with the drafter, see docs/interfaces.md and ready/drafter): anchor `a` is
the index of the last committed token; draft position j = 1..K predicts token a+j; the
drafter's context is tokens[:a]; the reader reads the GDN state after token a-1.

Labels must be the target's own greedy tokens, so the first label a+1 lies in the response:
a >= prompt_len - 1 (the very first round at inference drafts right after the prompt). The
first label must also be a real token: a+1 < length, where `length` counts the tokens up to
and including the first EOS. Later labels a+j past `length` are masked out, so blocks near
the end still train their early positions.
"""

from __future__ import annotations

import torch


def anchor_range(prompt_len: int, lengths: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Inclusive bounds [lo, hi[i]] of valid anchors per sequence (hi < lo: no valid anchor)."""
    lo = max(int(prompt_len) - 1, 1)  # a >= 1: the reader reads the state after token a-1
    return lo, lengths.long() - 2


def sample_anchors(
    lengths: torch.Tensor,
    prompt_len: int,
    proposals: int,
    num_anchors: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw `num_anchors` distinct anchors per sequence, uniformly over its valid range.

    lengths: [B] valid tokens per sequence. Returns anchors LongTensor [B, A] (sorted) and a
    label mask BoolTensor [B, A, K] (False where the label is past the sequence's end, and
    for every position of a padding anchor when a sequence has fewer than A candidates).
    Deterministic given the generator's state (resumed training replays the same draws).
    """
    lengths = lengths.long().cpu()
    B, A, K = lengths.shape[0], int(num_anchors), int(proposals)
    lo, hi = anchor_range(prompt_len, lengths)
    span = int((hi.max() - lo + 1).clamp_min(0)) if B else 0
    if span <= 0:
        return torch.full((B, A), lo, dtype=torch.long), torch.zeros(B, A, K, dtype=torch.bool)
    cand = lo + torch.arange(span)  # [span]
    ok = cand.unsqueeze(0) <= hi.unsqueeze(1)  # [B, span]
    keys = torch.rand(B, span, generator=generator)
    keys = keys.masked_fill(~ok, 2.0)  # invalid candidates sort last
    take = min(A, span)
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
    mask = (label_pos < lengths.view(B, 1, 1)) & kept.unsqueeze(-1)
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
