"""The frozen target's teacher pass over a batch of sequences, shared by the rows of a sweep worker.

Training (every stage) and the teacher-forced metric ask the frozen target the same question for a
batch of token sequences and their anchors: the context features of the layers the drafter reads,
the committed GDN states after `anchors - 1` (when the drafter reads state), and, for training, the
logits the teacher distributions are gathered from. Only positions from the lowest anchor on carry a
teacher (anchors lie in the response part), so the LM head runs on those rows alone; a teacher-forced
pass asks for no logits at all.

The answer depends on nothing but the target's weights, the tokens, the anchors and the layer lists,
and a sweep worker asks it again and again: every drafting row of a setting scores the same held-out
sequences teacher-forced, and the rows of one seed (reader ranks, the no-state control) train on the
same batches at the same anchors. So passes are kept in a per-process memo (LRU, bounded in bytes by
`train.teacher_memo_gb`, default 4, 0 = off; `MEMO.configure`; ready.memo), keyed by the weights' digest and the inputs' bytes.
A hit returns the very tensors the first pass computed, so a row's numbers do not depend on what the
worker ran before it. Read them, never write into them. The memo holds CPU passes of targets up to
1 GB of weights (the embedded default); larger targets and CUDA run every pass afresh. The state
placebo's passes (another row's states) and the base drafter's (one per seed) are never kept: no
other row asks for them. The base drafters' passes (and the no-state control's) mostly do not run
at all: on CPU they are rows of the teacher store (ready.train.teacher_store), the target's
features and final-norm outputs for every regenerated sequence, computed once for all seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ready.memo import MEMO, TeacherMemo
from ready.train.anchors import gather_blocks

__all__ = ["MEMO", "TeacherMemo", "TeacherPass", "TeacherPassError", "reads_shuffled_states", "teacher_pass"]


class TeacherPassError(ValueError):
    """A teacher pass asked for something its drafter cannot read; the message says what."""


@dataclass
class TeacherPass:
    """What the frozen target gives one batch: context features, states at anchors - 1, teacher logits."""

    hidden: Optional[torch.Tensor]  # [B, T, C, D] outputs of the drafter's capture layers
    states: Optional[torch.Tensor]  # [B, A, Ls, H, d_k, d_v] (None when the drafter reads no state)
    logits: Optional[torch.Tensor]  # [B, T - start, V]: positions start.. (None when not asked)
    start: int = 0  # position of logits[:, 0]

    def teacher(self, anchors: torch.Tensor, proposals: int) -> torch.Tensor:
        """The target logits that predict each anchor's K labels: [B, A, K, V] (positions a .. a+K-1)."""
        if self.logits is None:
            raise TeacherPassError("this teacher pass was run without logits; ask teacher_pass(..., logits=True)")
        return gather_blocks(self.logits, anchors - self.start, proposals, offset=0)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.hidden, self.states, self.logits) if t is not None)


def reads_shuffled_states(drafter: nn.Module) -> bool:
    """The state placebo (`reader.states: shuffled`): the reader reads another sequence's states."""
    return bool(drafter.state_layers) and drafter.reader_cfg.states == "shuffled"


@torch.no_grad()
def teacher_pass(target: nn.Module, drafter: nn.Module, tokens: torch.Tensor, anchors: torch.Tensor,
                 logits: bool = True, keep: bool = True) -> TeacherPass:
    """The frozen target's answer for `tokens` [B, T] at `anchors` [B, A] (see the module doc).
    `keep=False`: a question no later row asks (the base drafter's batches): not memoised.

    For the state placebo, row b gets the states of row b+1 (the last row: row 0) at row b's own
    positions: another text's states at the same place, so only the information differs. Under
    data-parallel training `tokens` is this rank's slice, so the rows roll within the slice."""
    shuffled = reads_shuffled_states(drafter)
    if shuffled and tokens.shape[0] < 2:
        raise TeacherPassError("reader.states=shuffled reads another sequence's states, so it needs batches of "
                               "at least 2 sequences (data-parallel: 2 per process); raise "
                               "train.<stage>.batch_size")
    capture, layers = tuple(int(i) for i in drafter.capture_layers), tuple(int(i) for i in drafter.state_layers)
    start = int(anchors.min()) if logits and anchors.numel() else 0
    key = None if shuffled or not keep else MEMO.key(target, tokens, anchors, capture, layers)
    if key is not None:
        hit = MEMO.get(key, logits, start)
        if hit is not None:
            return hit
    kw: dict[str, Any] = dict(capture_layers=list(capture), logits_from=start if logits else None)
    if layers:
        positions = anchors - 1
        if shuffled:
            positions = positions.roll(1, dims=0)  # row b+1 is asked for row b's positions ...
        kw.update(state_layers=list(layers), state_positions=positions)
    out = target(tokens, **kw)
    states = out.states
    if shuffled:
        states = states.roll(-1, dims=0)  # ... and hands them to row b
    result = TeacherPass(hidden=out.hidden, states=states if layers else None, logits=out.logits,
                         start=start if logits else 0)
    if key is not None:
        MEMO.put(key, result)
    return result
