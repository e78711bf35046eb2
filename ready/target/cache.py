"""Static inference cache of the hybrid target: GDN states, conv windows, attention KV.

Everything is preallocated once, so shapes never change between decoding rounds (CUDA-graph
friendly). `verify` writes each token's GDN inputs (k, v, decay, beta) and conv window into the
`pending_*` buffers and attention KV past `length`; `commit(n)` installs the GDN state after the n-th
verified token and its window and moves `length`, so rejected tokens leave no trace. On CUDA the commit
replays the first n tokens on the live states (kernels/gdn_verify.py `gdn_commit`: cheaper in memory
than keeping every token's fp32 state); elsewhere the verify keeps the state after every token in
`pending_states` and the commit copies one (a replay would cost a third of the verify on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch

from ready.target.config import HybridConfig


class GDNSlot(NamedTuple):
    """One GDN layer's views into the cache."""

    ssm: torch.Tensor  # [B, H_v, d_k, d_v]
    conv: torch.Tensor  # [B, conv_dim, kernel-1]
    pending_inputs: torch.Tensor  # [B, max_verify, H_v, d_k + d_v + 2]: k | v | g | beta per token and head
    pending_conv: torch.Tensor  # [B, max_verify, conv_dim, kernel-1]
    pending_states: Optional[torch.Tensor] = None  # [max_verify, B, H_v, d_k, d_v] fp32, where kept
    ends: Optional[torch.Tensor] = None  # [B] a right-padded prefill's prompt lengths (`HybridCache.ends`)


class KVSlot(NamedTuple):
    """One attention layer's views into the cache."""

    key: torch.Tensor  # [B, H_kv, max_len, head_dim]
    value: torch.Tensor
    length_t: torch.Tensor
    static: bool


@dataclass
class HybridCache:
    ssm: torch.Tensor  # [L_gdn, B, H_v, d_k, d_v] fp32, committed recurrent states
    conv: torch.Tensor  # [L_gdn, B, conv_dim, kernel-1], last inputs of the causal conv
    key: torch.Tensor  # [L_attn, B, H_kv, max_len, head_dim]
    value: torch.Tensor  # [L_attn, B, H_kv, max_len, head_dim]
    pending_inputs: torch.Tensor  # [L_gdn, B, max_verify, H_v, d_k + d_v + 2] fp32, each verified token's k|v|g|beta
    pending_conv: torch.Tensor  # [L_gdn, B, max_verify, conv_dim, kernel-1]
    length_t: torch.Tensor  # [] int64 on the device: `length` for static-shape (CUDA graph) passes
    length: int = 0  # committed tokens
    pending: int = 0  # tokens verified but not yet committed
    # static: attention reads the whole preallocated KV with a mask from `length_t`, so every
    # pass has fixed shapes and can be captured once in a CUDA graph and replayed at any length
    static: bool = False
    # the GDN state after each verified token [L_gdn, max_verify, B, H_v, d_k, d_v] fp32 (token-major), kept where the
    # commit has no replay kernel (`ready.target.layers.keeps_verify_states`); None elsewhere
    pending_states: Optional[torch.Tensor] = None
    # [B] int64 on the device, or None: the cache of one right-padded prefill of B prompts of these lengths
    # (`ready.target.ragged.prefill_rows`); each row's GDN state and conv window are those after its own last
    # token, and the pad tokens past it never enter them
    ends: Optional[torch.Tensor] = None
    gdn_slots: list[GDNSlot] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        states = [None] * len(self.ssm) if self.pending_states is None else self.pending_states
        self.gdn_slots = [GDNSlot(*t, ends=self.ends)
                          for t in zip(self.ssm, self.conv, self.pending_inputs, self.pending_conv, states)]

    def kv_slot(self, i: int) -> KVSlot:
        return KVSlot(self.key[i], self.value[i], self.length_t, self.static)

    @property
    def batch_size(self) -> int:
        return self.ssm.shape[1]

    @property
    def max_len(self) -> int:
        return self.key.shape[3]

    @property
    def max_verify(self) -> int:
        return self.pending_inputs.shape[2]

    @classmethod
    def allocate(
        cls,
        cfg: HybridConfig,
        batch_size: int,
        max_len: int,
        max_verify: int = 16,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        keep_states: bool = True,
        ends: Optional[torch.Tensor] = None,
    ) -> "HybridCache":
        """Zeroed buffers; `keep_states`: allocate `pending_states` (needed wherever the commit has no
        replay kernel); `ends`: the prompt lengths of a right-padded prefill (the field's comment)."""
        Lg, La = len(cfg.gdn_layer_ids), len(cfg.attn_layer_ids)
        H, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        w = cfg.linear_conv_kernel_dim - 1
        kv = (La, batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim)
        return cls(
            ssm=torch.zeros(Lg, batch_size, H, dk, dv, device=device, dtype=torch.float32),
            conv=torch.zeros(Lg, batch_size, cfg.gdn_conv_dim, w, device=device, dtype=dtype),
            key=torch.zeros(kv, device=device, dtype=dtype),
            value=torch.zeros(kv, device=device, dtype=dtype),
            pending_inputs=torch.zeros(Lg, batch_size, max_verify, H, dk + dv + 2, device=device, dtype=torch.float32),
            pending_conv=torch.zeros(Lg, batch_size, max_verify, cfg.gdn_conv_dim, w, device=device, dtype=dtype),
            length_t=torch.zeros((), dtype=torch.long, device=device),
            pending_states=(torch.zeros(Lg, max_verify, batch_size, H, dk, dv, device=device, dtype=torch.float32)
                            if keep_states else None),
            ends=ends,
        )

    def reset(self) -> None:
        """Forget the sequence (states zeroed, nothing committed)."""
        self.ssm.zero_()
        self.conv.zero_()
        self.length = 0
        self.length_t.zero_()
        self.pending = 0

    def advance(self, n: int) -> None:
        """Record n more committed tokens."""
        self.length += n
        self.length_t += n
