"""The teacher store: the frozen target's answers for every regenerated sequence, computed once.

A drafter that reads no state (the base DSpark drafter, the no-state control's two stages) asks the
target the same two things at every training step: the outputs of its capture layers over its batch
(`hidden` [B, T, C, D]) and the logits from the batch's lowest anchor on. Both are answers about one
sequence at a time, and anchors never lie before prompt_len - 1 (ready.train.anchors). The default
sweep trains three base drafters side by side, one per seed, 200 steps of 8 sequences each, on the
same 1,000 sequences: 4,800 sequence passes (~0.5 s of a ~1.25 s step) for what 1,000 answer. So the
store keeps, for every sequence, the capture-layer features [T, C, D] and the final norm's output h
(the LM head's input) at positions prompt_len - 1 .. T - 1; a step's `TeacherPass` is the rows of its
batch, its logits computed from the stored h by the target's own head (`HybridLM.head`), as the pass
computes them.

It changes no number, and is used only where that is checked. The store is built in passes of the
training batch's shape ([batch, T]; a short last batch is filled up with the first sequences), so a
step's pass and the store's differ only in which sequence sits in which slot of the batch. On CPU the
linears give a row the same bits in any slot, and attention, the GDN chunk form, the conv and the
norms work per sequence, but an elementwise op (exp, softplus, silu, ...) rounds the last elements of
a vectorised loop, its scalar tail, differently; whether a tail exists depends on the shapes (the
embedded default has none; a micro target with odd T does) and on the thread count. So before a
store serves a stage, `TeacherStore.exact` runs its first batch rotated through every slot at the
current thread count and compares (torch.equal); `TeacherStore.serves` also asks for a CPU target,
a drafter without state layers, the store's data, target weights, capture layers and batch size.
Everything else runs `teacher_pass`.

One artifact per (target weights, regenerated data, capture layers, batch size):
`<artifacts>/teacher_store/<hash>/store.pt`, written atomically and verified before use
(ready.artifacts.cached), built by the process that builds a sweep's shared artifacts and read by
the base processes with torch.load(mmap=True), so they share one copy in the page cache. Embedded
default: 1,000 × 176 × 5 × 256 fp32 features + 1,000 × 49 × 256 h ≈ 0.95 GB. No store (so every pass
as before) for targets off the CPU or above 1 GB of weights, under data-parallel training, above
MAX_STORE_BYTES, or with `train.length_buckets` > 0: a bucketed batch is cut to its longest row, and a
pass over fewer columns rounds differently from the stored full-width row (equal up to rounding, by
causality, but not bit for bit), so `train_stage` never lets a store serve it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ready.artifacts import artifact_dir, atomic_torch_save, cached, intact
from ready.drafter.layer_map import map_context_layers
from ready.memo import weights_digest
from ready.train import distributed
from ready.train.anchors import first_anchor
from ready.train.regen import RegenData, build_regen_data, target_fingerprint
from ready.train.teacher_pass import TeacherPass

KIND = "teacher_store"
STORE_FILE = "store.pt"
MAX_STORE_BYTES = 8 << 30  # larger stores are not built: every pass runs as before


def target_key(target: nn.Module) -> Optional[str]:
    """The target's identity for a store: config + sampled weights (as the regen cache) and a digest of
    every weight byte; None where no store is kept (above 1 GB of weights, inference tensors)."""
    weights = weights_digest(target)
    return None if weights is None else f"{target_fingerprint(target)}-{weights}"


def store_capture(cfg: Any, target: nn.Module) -> tuple[int, ...]:
    """The capture layers of the drafter `cfg.drafter` builds on `target` (as DSparkDrafter maps them)."""
    return tuple(map_context_layers(cfg.drafter.context_layers, int(target.config.num_hidden_layers),
                                    space=cfg.drafter.layer_space))


@dataclass
class TeacherStore:
    """Per regenerated sequence: capture-layer features and the final norm's output from `first` on."""

    tokens: torch.Tensor  # [N, T] the sequences
    features: torch.Tensor  # [N, T, C, D] outputs of the capture layers
    normed: torch.Tensor  # [N, T - first, D] final-norm output (the LM head's input) at first .. T-1
    first: int  # position of normed[:, 0]: the lowest anchor any sequence can have
    capture: tuple[int, ...]
    batch: int  # sequences per pass, as in the training steps it serves
    target: str  # target_key of the target that computed it
    _exact: dict[int, bool] = field(default_factory=dict, repr=False)  # thread count -> `exact`

    def ids(self, s: int) -> torch.Tensor:
        """The sequences of the store's pass from `s`: batch ids, the last pass filled up from 0."""
        return torch.arange(s, s + self.batch) % self.tokens.shape[0]

    @classmethod
    @torch.no_grad()
    def build(cls, target: nn.Module, data: RegenData, capture: Sequence[int], batch: int = 8,
              progress: bool = True) -> "TeacherStore":
        """Run the target over every sequence of `data`, `batch` at a time (no LM head)."""
        N, T = data.tokens.shape
        first = first_anchor(data.trainable())
        D, dtype = int(target.config.hidden_size), target.dtype
        store = cls(data.tokens.clone(), torch.empty(N, T, len(capture), D, dtype=dtype),
                    torch.empty(N, T - first, D, dtype=dtype), first, tuple(int(i) for i in capture), int(batch),
                    str(target_key(target)))
        with tqdm(total=N, desc="teacher store", unit="seq", disable=not progress) as bar:
            for s in range(0, N, store.batch):
                out = target(store.tokens[store.ids(s)].to(target.device), capture_layers=list(store.capture),
                             logits_from=None, normed=True)
                n = min(store.batch, N - s)
                store.features[s : s + n] = out.hidden[:n]
                store.normed[s : s + n] = out.normed[:n, first:]
                bar.update(n)
        return store

    def save(self, path: str | Path) -> None:
        atomic_torch_save({"tokens": self.tokens, "features": self.features, "normed": self.normed,
                           "first": self.first, "capture": list(self.capture), "batch": self.batch,
                           "target": self.target}, path)

    @classmethod
    def load(cls, path: str | Path) -> "TeacherStore":
        """The store in `path`, memory-mapped (processes reading one file share its pages)."""
        raw = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return cls(raw["tokens"], raw["features"], raw["normed"], int(raw["first"]),
                   tuple(int(i) for i in raw["capture"]), int(raw["batch"]), str(raw["target"]))

    def serves(self, target: nn.Module, drafter: nn.Module, data: RegenData, batch_size: int) -> bool:
        """Whether this store answers every pass `drafter` asks of `target` on `data` in batches of
        `batch_size` exactly as `teacher_pass` would: CPU, no state read, the same capture layers, data,
        target weights and batch size, and `exact` at this thread count."""
        return (target.device.type == "cpu" and not drafter.state_layers and int(batch_size) == self.batch
                and tuple(int(i) for i in drafter.capture_layers) == self.capture
                and torch.equal(data.tokens, self.tokens) and first_anchor(data.trainable()) == self.first
                and target_key(target) == self.target and self.exact(target))

    @torch.no_grad()
    def exact(self, target: nn.Module) -> bool:
        """Whether the target's passes at this thread count give the stored rows bit for bit wherever a
        sequence sits in its batch: the store's first pass, rotated through every slot, run afresh and
        compared (features and logits); once per thread count. A mismatch is said once on stderr."""
        threads = torch.get_num_threads()
        if threads not in self._exact:
            ok = True
            for r in range(1, self.batch):
                ids = self.ids(0).roll(r)
                out = target(self.tokens[ids].to(target.device), capture_layers=list(self.capture),
                             logits_from=self.first)
                ok = torch.equal(out.hidden, self.features[ids]) and torch.equal(out.logits, target.head(self.normed[ids]))
                if not ok:
                    print(f"[ready] teacher store: a pass with the sequences in other batch slots differs from the "
                          f"stored rows ({threads} threads; an elementwise op's vector tail); every teacher pass "
                          "runs afresh", file=sys.stderr, flush=True)
                    break
            self._exact[threads] = ok
        return self._exact[threads]

    @torch.no_grad()
    def teacher_pass(self, target: nn.Module, idx: torch.Tensor, anchors: torch.Tensor) -> Optional[TeacherPass]:
        """The pass of sequences `idx` [B] at `anchors` [B, A] (teacher logits from the lowest anchor on),
        as `teacher_pass(target, drafter, tokens[idx], anchors, keep=False)` gives it; None when an
        anchor lies before the stored positions."""
        start = int(anchors.min()) if anchors.numel() else 0
        if start < self.first:
            return None
        idx = idx.cpu()
        h = self.normed[idx]  # [B, T - first, D]; sliced as HybridLM._run slices its h
        return TeacherPass(hidden=self.features[idx], states=None, logits=target.head(h[:, start - self.first :]),
                           start=start)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tokens, self.features, self.normed))


_LOADED: dict[tuple, TeacherStore] = {}  # this process's stores by file (path, inode, mtime): checked once


def ensure_teacher_store(cfg: Any, target: nn.Module, tokenizer: Any, progress: bool = True,
                         prompts: Optional[torch.Tensor] = None, build: bool = True) -> Optional[TeacherStore]:
    """The teacher store of `cfg`'s regenerated training data, target and drafter capture layers, in
    passes of `train.base.batch_size` (cached; built on first use unless `build=False`, which only
    reads one already built). None where no store applies: a target off the CPU or above 1 GB of
    weights, data-parallel training, a store above MAX_STORE_BYTES, length-bucketed batches
    (`train.length_buckets` > 0, which are cut to their longest row), or (when building) a given
    `drafter.checkpoint`, which trains no base drafter."""
    if target.device.type != "cpu" or distributed.world().active or (build and cfg.drafter.checkpoint):
        return None
    if cfg.train.length_buckets:
        return None
    key = target_key(target)
    if key is None:
        return None
    data, folder = build_regen_data(cfg, target, tokenizer, prompts=prompts, progress=progress)
    capture, batch = store_capture(cfg, target), int(cfg.train.base.batch_size)
    N, T = data.tokens.shape
    first = first_anchor(data.trainable())
    if N * (T * len(capture) + T - first) * int(target.config.hidden_size) * target.dtype.itemsize > MAX_STORE_BYTES:
        return None
    spec = {"kind": KIND, "data": folder.name, "target": key, "capture": list(capture), "batch": batch, "first": first,
            "threads": int(cfg.threads.shared)}
    store_dir = artifact_dir(cfg.artifacts_dir, KIND, spec)
    held = _LOADED.get(_file_key(store_dir / STORE_FILE))
    if held is not None:  # verified and loaded by this process from this very file
        return held
    if not build and not intact(store_dir, spec):
        return None
    if build:
        cached(cfg.artifacts_dir, KIND, spec,
               lambda tmp: TeacherStore.build(target, data, capture, batch, progress).save(tmp / STORE_FILE))
    path = store_dir / STORE_FILE
    store = _LOADED[_file_key(path)] = TeacherStore.load(path)
    return store


def _file_key(path: Path) -> Optional[tuple]:
    """(path, inode, mtime) of a store file (None when it is missing): a rewritten file is a new key."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return str(path), st.st_ino, st.st_mtime_ns
