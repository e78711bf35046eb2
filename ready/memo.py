"""Per-process memos of a sweep worker: a byte-bounded LRU and the digests that key it.

A sweep worker asks the frozen target the same questions again and again (ready.train.teacher_pass,
the state placebo's donor states in ready.decode.donor), so answers are kept per process, up to
`READY_TEACHER_MEMO_GB` (default 4; 0 = off), keyed by a digest of the target's weights and of the
inputs' bytes. `memo_budget()` reads that budget; the keys come from `weights_digest` and `tensor_digest`.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Any, Optional

import torch
from torch import nn

MEMO_ENV = "READY_TEACHER_MEMO_GB"
DEFAULT_MEMO_GB = 4.0
MAX_MEMO_TARGET_BYTES = 1 << 30  # weights hashed once per target object: cheap only for small targets


class MemoError(ValueError):
    """The memo's budget variable is not a number; the message names it."""


def memo_budget() -> int:
    """Bytes a memo may hold: READY_TEACHER_MEMO_GB (default 4; 0 = off), read now."""
    raw = os.environ.get(MEMO_ENV, str(DEFAULT_MEMO_GB))
    try:
        gb = float(raw)
    except ValueError:
        raise MemoError(f"{MEMO_ENV}={raw!r}; expected a number of gigabytes (0 = no memo)") from None
    return max(0, int(gb * (1 << 30)))


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
