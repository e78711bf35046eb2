"""The state placebo's donor states: another prompt's committed GDN states at every length a generation reads.

A drafting row that decodes on another prompt's states (the placebo row, the state swap of `ready`
rows) reads, in the round after `c` committed tokens, the donor's states after min(c, donor length)
tokens. Those are fixed before the generation starts: a generation of prompt length p and budget n
reads them after p .. p+n-1 tokens. One forward pass of the donor with state positions gives them
all (the chunked GDN form, as in training), and every row of a setting reads the same donors, so the
passes are kept per process (LRU, up to DONOR_MEMO_BYTES; off with train.teacher_memo_gb=0, like the
teacher-pass memo; CPU targets the memo can digest only).
"""

from __future__ import annotations

from typing import Sequence

import torch

from ready.memo import MEMO, BytesLRU, tensor_digest, weights_digest

DONOR_MEMO_BYTES = 1 << 30
_KEPT = BytesLRU(DONOR_MEMO_BYTES)


def read_lengths(prompt_len: int, max_new_tokens: int, donor_len: int) -> list[int]:
    """Donor tokens the reader sees in each round a generation can run: after c = p .. p+n-1 committed."""
    return [min(c, donor_len) for c in range(prompt_len, prompt_len + max(1, max_new_tokens))]


@torch.no_grad()
def donor_states(target, donor: torch.Tensor, lengths: Sequence[int], layers: Sequence[int]) -> torch.Tensor:
    """The donor's committed states of GDN `layers` after each of `lengths` tokens: [n, Ls, H, d_k, d_v] float32."""
    ids = donor.reshape(-1)[: max(lengths)]
    pos = torch.tensor([[n - 1 for n in lengths]], dtype=torch.long)
    key = None
    if MEMO.budget and ids.device.type == "cpu":
        weights = weights_digest(target)
        if weights is not None:
            key = (weights, tensor_digest(ids), tensor_digest(pos), tuple(int(i) for i in layers))
    kept = None if key is None else _KEPT.get(key)
    if kept is not None:
        return kept
    out = target(ids[None], state_layers=list(layers), state_positions=pos.to(ids.device), logits_from=None)
    states = out.states[0]  # [n, Ls, H, d_k, d_v]
    if key is not None:
        _KEPT.put(key, states, states.numel() * states.element_size())
    return states


def clear() -> None:
    """Forget every kept donor pass (tests)."""
    _KEPT.clear()
