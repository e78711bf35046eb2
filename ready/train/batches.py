"""Which sequences make up each training batch, and how wide its tensors are.

`batch_indices` is the default order: batch `step` is the slice [step·B, (step+1)·B) of a stream
of per-epoch shuffles, a deterministic function of the seed and the step (a resumed stage replays
the same batches). Rows are as wide as the data's longest row.

Conversations vary in length, so most of a full-width batch can be padding. With
`train.length_buckets = N > 0` (`BatchSampler`), each epoch's shuffle is cut into chunks of N
batches, the rows of a chunk are sorted by length (longest first; ties keep the shuffled order)
and cut into batches, and the chunk's full batches are shuffled among themselves, so the rows of
a batch have similar lengths and the order of long and short batches stays random (the common
"bucket sampler"). Chunks are aligned to the batch grid of the stream, so a batch lies within one
chunk (except the one that spans two epochs). Every row is still visited once per epoch, and the
order depends only on the seed, the step and the rows' lengths: data-parallel ranks compute the
same global batch and take their slices of it, as without buckets.

A bucketed batch is then cut to its longest row (`batch_width`): padding sits on the right only,
and the target, the teacher pass and the drafter are causal (the drafter's block at anchor a sees
positions < a, its labels are a+1..a+K), so the cut columns never influence a kept position and
carry no label or anchor (anchors lie on trainable positions, ready.train.anchors). The loss is the
full-width loss up to floating-point rounding. Attention never crosses rows: a batch is padded
rows, never packed ones.
"""

from __future__ import annotations

from typing import Optional

import torch

from ready.train.regen import RegenData


class BatchError(ValueError):
    """Bad batching input; the message says what was expected."""


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> torch.Tensor:
    """Sequence ids of batch `step`: consecutive slices of per-epoch shuffles (deterministic)."""
    pos = torch.arange(step * batch_size, (step + 1) * batch_size)
    epochs = (pos // n).unique().tolist()
    perms = {}
    for e in epochs:
        perms[e] = _epoch_perm(n, seed, int(e))[0]
    return torch.stack([perms[int(p // n)][int(p % n)] for p in pos])


def _epoch_perm(n: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Generator]:
    """Epoch `epoch`'s shuffle of n rows, and the generator that drew it (for further draws)."""
    g = torch.Generator().manual_seed(seed * 7919 + int(epoch))
    return torch.randperm(n, generator=g), g


def bucketed_epoch(lengths: torch.Tensor, batch_size: int, buckets: int, seed: int, epoch: int) -> torch.Tensor:
    """The rows of epoch `epoch` in length-bucketed order: a permutation of range(len(lengths)).

    The epoch's shuffle (the same one `batch_indices` uses) is cut, along the batch grid of the
    stream, into chunks of `buckets` batches; each chunk's rows are sorted by length, longest first
    (stable: ties keep the shuffle), and the chunk's full batches are shuffled among themselves."""
    lengths = torch.as_tensor(lengths).long().cpu()
    n, B = int(lengths.numel()), int(batch_size)
    if n == 0 or B < 1 or int(buckets) < 1:
        raise BatchError(f"bucketed batches need rows, batch_size >= 1 and buckets >= 1; got {n} rows, "
                         f"batch_size={batch_size}, buckets={buckets}")
    perm, g = _epoch_perm(n, seed, epoch)
    first = min(n, (-int(epoch) * n) % B)  # positions that finish the batch begun in the previous epoch
    cuts = ([0, first] if first else [0]) + list(range(first + int(buckets) * B, n, int(buckets) * B)) + [n]
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        ids = perm[a:b]
        ids = ids[torch.sort(lengths[ids], descending=True, stable=True).indices]
        groups = list(ids.split(B)) if a >= first else [ids]  # the head piece is one partial batch
        full = [x for x in groups if x.numel() == B]
        rest = [x for x in groups if x.numel() != B]  # at most the chunk's last group (end of the epoch)
        out += [full[i] for i in torch.randperm(len(full), generator=g).tolist()] + rest
    return torch.cat(out)


class BatchSampler:
    """Sequence ids of every training batch: `batch_indices` (buckets = 0), or length-bucketed
    batches (`bucketed_epoch`, buckets = N > 0); a deterministic function of the seed and the step."""

    def __init__(self, n: int, batch_size: int, seed: int, lengths: Optional[torch.Tensor] = None,
                 buckets: int = 0) -> None:
        if int(buckets) < 0:
            raise BatchError(f"train.length_buckets = {buckets}; expected an integer >= 0 (0 = off)")
        if int(buckets) > 0 and (lengths is None or int(torch.as_tensor(lengths).numel()) != int(n)):
            raise BatchError(f"length-bucketed batches need one length per row ({n} rows); got "
                             f"{None if lengths is None else int(torch.as_tensor(lengths).numel())}")
        self.n, self.batch_size, self.seed, self.buckets = int(n), int(batch_size), int(seed), int(buckets)
        self.lengths = None if lengths is None else torch.as_tensor(lengths).long().cpu()
        self._epochs: dict[int, torch.Tensor] = {}  # the last few epochs' bucketed orders

    def __call__(self, step: int) -> torch.Tensor:
        if self.buckets == 0:
            return batch_indices(step, self.batch_size, self.n, self.seed)
        pos = torch.arange(step * self.batch_size, (step + 1) * self.batch_size)
        return torch.stack([self.epoch(int(p // self.n))[int(p % self.n)] for p in pos])

    def epoch(self, e: int) -> torch.Tensor:
        """Epoch e's order of the rows (bucketed)."""
        if e not in self._epochs:
            if len(self._epochs) >= 4:
                self._epochs.pop(min(self._epochs))
            self._epochs[e] = bucketed_epoch(self.lengths, self.batch_size, self.buckets, self.seed, e)
        return self._epochs[e]


def batch_width(data: RegenData, idx: torch.Tensor, anchors: torch.Tensor) -> int:
    """Columns a batch of rows `idx` needs: its longest row (never less than its last anchor + 1)."""
    width = int(data.lengths[idx.cpu()].max()) if idx.numel() else 1
    if anchors.numel():
        width = max(width, int(anchors.max()) + 1)
    return min(int(data.tokens.shape[1]), width)
