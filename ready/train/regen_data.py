"""The container of target-regenerated data (`RegenData`, saved as `data.pt`) and the target's fingerprint.

`ready.train.regen` builds prompt continuations and `ready.train.conversations` regenerated
conversations; both keep them in a `RegenData` and name their artifacts by `target_fingerprint`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from ready.artifacts import atomic_torch_save

DATA_FILE = "data.pt"


class RegenError(ValueError):
    """Bad input for regenerated data (prompts, file); the message says what was expected."""


@dataclass
class RegenData:
    """Training sequences whose responses the target generated, one row per sample.

    Either prompt + response of fixed lengths (the corpus prompts), or rendered conversations of
    varying length (`loss_mask` given: True on the assistant tokens, the only ones trained on)."""

    tokens: torch.Tensor  # LongTensor [N, T]
    prompt_len: int  # tokens before the first trainable one in every row (1 for conversations)
    lengths: torch.Tensor  # LongTensor [N], valid tokens per row (<= tokens.shape[1])
    loss_mask: Optional[torch.Tensor] = None  # BoolTensor [N, T]: trainable (target-generated) tokens

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def trainable(self, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """BoolTensor [n, T]: the tokens a draft label may be (the target's own tokens): the
        assistant tokens of a conversation, else the response part up to the row's length."""
        rows = torch.arange(len(self)) if rows is None else rows
        if self.loss_mask is not None:
            return self.loss_mask[rows]
        pos = torch.arange(self.tokens.shape[1]).unsqueeze(0)
        return (pos >= self.prompt_len) & (pos < self.lengths[rows].unsqueeze(1))

    @property
    def response_len(self) -> int:
        return int(self.tokens.shape[1]) - self.prompt_len

    def save(self, path: str | Path) -> None:
        raw = {"tokens": self.tokens.cpu(), "prompt_len": self.prompt_len, "lengths": self.lengths.cpu()}
        if self.loss_mask is not None:
            raw["loss_mask"] = self.loss_mask.cpu()
        atomic_torch_save(raw, path)

    @classmethod
    def load(cls, path: str | Path) -> "RegenData":
        path = Path(path)
        if path.is_dir():
            path = path / DATA_FILE
        if not path.is_file():
            raise RegenError(f"regenerated data file {str(path)!r} does not exist; expected a {DATA_FILE} built by ready.train.regen")
        raw = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(raw, dict) or not {"tokens", "prompt_len", "lengths"} <= set(raw):
            raise RegenError(f"{str(path)!r} is not regenerated data; expected a dict with tokens, prompt_len, lengths")
        mask = raw.get("loss_mask")
        return cls(tokens=raw["tokens"].long(), prompt_len=int(raw["prompt_len"]), lengths=raw["lengths"].long(),
                   loss_mask=None if mask is None else mask.bool())


def target_fingerprint(target: Any) -> str:
    """A content hash of the target: its config and a strided sample of every weight.

    Cheap for a 27B model (a few thousand values per tensor), and any retrained or
    different checkpoint changes it. Kept on the target object with its tensors' version counters (a row
    asks for it a dozen times; at 27B each computation copies ~800 samples off the GPU) and computed again
    after any in-place change of a weight.
    """
    cfg = target.config
    state = sorted(target.state_dict(keep_vars=True).items())
    text = repr(sorted(cfg.to_hf_dict().items()) if hasattr(cfg, "to_hf_dict") else cfg)
    try:
        versions: Any = (text, tuple((name, p.data_ptr(), p._version) for name, p in state))
    except RuntimeError:  # inference tensors keep no version counter: computed every time
        versions = None
    held = getattr(target, "_ready_fingerprint", None)
    if versions is not None and held is not None and held[0] == versions:
        return held[1]
    h = hashlib.sha256()
    h.update(text.encode())
    for name, p in state:
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(flat[::step].float().cpu().numpy().tobytes())
    digest = h.hexdigest()[:16]
    try:
        if versions is not None:
            target._ready_fingerprint = (versions, digest)
    except (AttributeError, TypeError):  # an object that takes no attributes: computed every time
        pass
    return digest
