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
`train.teacher_memo_gb`, default 4, 0 = off; `MEMO.configure`), keyed by the weights' digest and the inputs' bytes.
A hit returns the very tensors the first pass computed, so a row's numbers do not depend on what the
worker ran before it. Read them, never write into them. The memo holds CPU passes of targets up to
1 GB of weights (the embedded default); larger targets and CUDA run every pass afresh. The state
placebo's passes (another row's states) and the base drafter's (one per seed) are never kept: no
other row asks for them. The base drafters' passes (and the no-state control's) mostly do not run
at all: on CPU they are rows of the teacher store (ready.train.teacher_store), the target's
features and final-norm outputs for every regenerated sequence, computed once for all seeds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from ready.train.anchors import gather_blocks

DEFAULT_MEMO_GB = 4.0  # train.teacher_memo_gb's default, for a process that never configures the memo
MAX_MEMO_TARGET_BYTES = 1 << 30  # weights hashed once per target object: cheap only for small targets


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
    return bool(drafter.state_layers) and getattr(drafter, "reader_cfg", {}).get("states", "own") == "shuffled"


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


class BytesLRU:
    """Values by key, the least recently used dropped once their bytes pass `budget` (a value larger
    than the whole budget is not kept)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()  # key -> (value, bytes)
        self.nbytes = 0

    def get(self, key: tuple) -> Any:
        if key not in self.entries:
            return None
        self.entries.move_to_end(key)
        return self.entries[key][0]

    def put(self, key: tuple, value: Any, size: int) -> None:
        if size > self.budget:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        self.entries[key] = (value, size)
        self.nbytes += size
        while self.nbytes > self.budget:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.nbytes -= dropped

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0


class TeacherMemo:
    """Teacher passes by (weights, tokens, anchors, layers), least recently used evicted past the budget."""

    def __init__(self, gb: float = DEFAULT_MEMO_GB) -> None:
        self.budget = 0
        self._lru: Optional[BytesLRU] = None
        self.configure(gb)

    def configure(self, gb: float) -> None:
        """Keep up to `gb` gigabytes of passes (`train.teacher_memo_gb`; 0 = off); forgets what it held
        when the budget changes."""
        if gb < 0:
            raise TeacherPassError(f"train.teacher_memo_gb={gb}; expected a number of gigabytes >= 0 (0 = no memo)")
        budget = int(gb * (1 << 30))
        if budget != self.budget or self._lru is None:
            self.budget, self._lru = budget, None
            self.hits = self.misses = 0

    @property
    def lru(self) -> BytesLRU:
        if self._lru is None:
            self._lru = BytesLRU(self.budget)
        return self._lru

    def clear(self) -> None:
        self.lru.clear()
        self.hits = self.misses = 0

    def key(self, target: nn.Module, tokens: torch.Tensor, anchors: torch.Tensor, capture: tuple,
            layers: tuple) -> Optional[tuple]:
        """The pass's key, or None when it is not kept (memo off, CUDA, a large target)."""
        if self.budget == 0 or tokens.device.type != "cpu":
            return None
        weights = weights_digest(target)
        if weights is None:
            return None
        where = tensor_digest(anchors) if layers else tensor_digest(anchors.min())  # states: every anchor
        return (weights, tensor_digest(tokens), where, capture, layers)

    def get(self, key: tuple, logits: bool, start: int) -> Optional[TeacherPass]:
        """A kept pass that answers `key`: the same one, or, when no states are asked, any pass of the
        same weights, tokens and capture layers (its states unused) with logits from `start` if asked."""
        def serves(p: TeacherPass) -> bool:
            return not logits or (p.logits is not None and p.start == start)

        entries = self.lru.entries
        found = key if key in entries and serves(entries[key][0]) else None
        if found is None and not key[4]:
            found = next((k for k, (p, _) in entries.items()
                          if k[0] == key[0] and k[1] == key[1] and k[3] == key[3] and serves(p)), None)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        hit = self.lru.get(found)
        if found != key:  # another row's pass: hand over what this one asked for
            hit = TeacherPass(hidden=hit.hidden, states=None, logits=hit.logits if logits else None,
                              start=hit.start if logits else 0)
        return hit

    def put(self, key: tuple, value: TeacherPass) -> None:
        self.lru.put(key, value, value.nbytes())

    @property
    def nbytes(self) -> int:
        return self.lru.nbytes

    def __len__(self) -> int:
        return len(self.lru.entries)


MEMO = TeacherMemo()


def weights_digest(target: nn.Module) -> Optional[str]:
    """A digest of the target's parameters and buffers (None above MAX_MEMO_TARGET_BYTES). It is kept on
    the target object with the tensors' version counters and computed again after any in-place change, so
    two loads of the same checkpoint share passes and changed weights never meet an old pass."""
    tensors = list(target.state_dict(keep_vars=True).items())
    try:
        versions = tuple(t._version for _, t in tensors)
    except RuntimeError:  # inference tensors keep no version counter: no memo for this target
        return None
    cached = getattr(target, "_teacher_digest", None)
    if cached is not None and cached[0] == versions:
        return cached[1]
    total = sum(t.numel() * t.element_size() for _, t in tensors)
    digest = None
    if total <= MAX_MEMO_TARGET_BYTES:
        h = hashlib.blake2b(digest_size=16)
        seen: set[int] = set()
        for name, t in tensors:
            if t.data_ptr() in seen:  # tied weights (embeddings = LM head) hash once
                continue
            seen.add(t.data_ptr())
            h.update(name.encode())
            h.update(str((tuple(t.shape), t.dtype)).encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        digest = h.hexdigest()
    object.__setattr__(target, "_teacher_digest", (versions, digest))
    return digest


def tensor_digest(t: torch.Tensor) -> str:
    """A digest of a tensor's shape, dtype and bytes (memo keys)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return hashlib.blake2b(str((tuple(t.shape), t.dtype)).encode() + t.view(torch.uint8).numpy().tobytes(),
                           digest_size=16).hexdigest()
