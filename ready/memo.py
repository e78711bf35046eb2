"""Per-process memos of the frozen target's passes: a byte-bounded LRU, the digests that key it, the teacher memo.

A sweep worker asks the frozen target the same questions again and again: the teacher passes of
training and of the teacher-forced metric (ready.train.teacher_pass) and the state placebo's donor
passes (ready.decode.donor). Both keep answers per process, keyed by a digest of the target's weights
and of the inputs' bytes, while `train.teacher_memo_gb` > 0 (`MEMO.configure`, where a run loads its
target: ready.loading). The memo lives below both, so the decoding engine and training share it
without importing each other.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from typing import Any, Optional

import torch
from torch import nn

DEFAULT_MEMO_GB = 4.0  # train.teacher_memo_gb's default, for a process that never configures the memo
MAX_MEMO_TARGET_BYTES = 1 << 30  # weights hashed once per target object: cheap only for small targets


class MemoError(ValueError):
    """The memo's budget is unusable; the message names the key."""


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
    """Teacher passes (ready.train.teacher_pass.TeacherPass) by (weights, tokens, anchors, layers), least
    recently used evicted past the budget."""

    def __init__(self, gb: float = DEFAULT_MEMO_GB) -> None:
        self.budget = 0
        self._lru: Optional[BytesLRU] = None
        self.configure(gb)

    def configure(self, gb: float) -> None:
        """Keep up to `gb` gigabytes of passes (`train.teacher_memo_gb`; 0 = off); forgets what it held
        when the budget changes."""
        if gb < 0:
            raise MemoError(f"train.teacher_memo_gb={gb}; expected a number of gigabytes >= 0 (0 = no memo)")
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

    def get(self, key: tuple, logits: bool, start: int) -> Any:
        """A kept pass that answers `key`: the same one, or, when no states are asked, any pass of the
        same weights, tokens and capture layers (its states unused) with logits from `start` if asked."""
        def serves(p: Any) -> bool:
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
            hit = dataclasses.replace(hit, states=None, logits=hit.logits if logits else None,
                                      start=hit.start if logits else 0)
        return hit

    def put(self, key: tuple, value: Any) -> None:
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
