"""One DSpark draft layer: attention over (target context features ++ the draft block), then an MLP.

The layers are Qwen3 decoder layers with the drafter's own shape (query heads, KV heads, head dim,
MLP width, rotary), as DSpark checkpoints define them; only the hidden size is the target's. The
block's queries attend to two kinds of keys/values: the projected target features of the
committed prefix (the "context", shared by every layer but projected by each layer's own k/v
maps) and the block itself, bidirectionally. A layer can carry a hook that edits its normed
input before attention (`pre`) or after attention, at the post-attention norm, before the MLP
(`post`); that is where the ReaDy reader is injected.

Drafting on CUDA (no autograd), the projections run the tuned small-M GEMM, and the norms and the
rotations one Triton kernel each (`ready.fastops.drafting_ops`); training and CPU run the torch ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from ready import fastops
from ready.target.layers import SplitKV, linear

Hook = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class BufferedContext:
    """One layer's context K/V for the fixed-shape (CUDA-graph) draft steps: static buffers
    [B, H_kv, cap, hd] whose first `n` rows are the committed context (`n` a device scalar, or [B] per
    row in the batched step), with room for the block at n..n+N-1. With `split_kv` the block's K/V are
    written there and one split-key pass reads keys < n + N only, so the cost follows the context, not
    the buffer; otherwise (CPU, fp32) SDPA runs over buffer ++ block under `mask` [B, 1, N, cap + N].
    `rows` [1 or B, N]: the block's rows n..n+N-1 in the buffers (with `split_kv`), one tensor that every
    layer of the step shares."""

    k: torch.Tensor
    v: torch.Tensor
    n: torch.Tensor
    window: int = 0  # the last `window` context positions only (0: all)
    mask: Optional[torch.Tensor] = None
    split_kv: Optional[SplitKV] = None
    rows: Optional[torch.Tensor] = None

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """With `split_kv`: the block's queries q [B, H, N, hd] over the buffers, which already hold the
        block's K/V at `rows` (`ContextAttention.store_kv`): one split-key pass over keys < n + N."""
        N = q.shape[2]
        last = self.rows[:, -1:].expand(q.shape[0], N)  # every query sees keys 0 .. n + N - 1
        return self.split_kv(q, self.k, self.v, last, self.window + N if self.window else 0)

    def attend_masked(self, q: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, gqa: bool) -> torch.Tensor:
        """Without `split_kv`: SDPA of the block's queries over buffer ++ block (kb, vb [B, H_kv, N, hd])
        under `mask`."""
        k, v = torch.cat([self.k, kb], dim=2), torch.cat([self.v, vb], dim=2)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=gqa)


def store_rotated(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_buf: torch.Tensor,
                  v_buf: torch.Tensor, rows: torch.Tensor) -> None:
    """Rotate the keys k [B, H_kv, N, hd] and write them and the values v into the buffers [B, H_kv, cap, hd]
    at rows [1 or B, N]. Drafting on CUDA, one kernel that also rotates (`ready_kernels.rope.rope_store`);
    otherwise `apply_rope` and two scatters."""
    fast = _rotary_ops(k, cos)
    if fast is not None:
        fast.rope_store(k, v, cos, signed_sin, k_buf, v_buf, rows)
        return
    idx = rows[:, None, :, None].expand(k.shape)
    k_buf.scatter_(2, idx, apply_rope(k, cos, signed_sin))
    v_buf.scatter_(2, idx, v)


def project(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x through a projection: a plain bias-free nn.Linear through the small-M linear (its tuned Triton
    GEMM while drafting on CUDA; F.linear, the same as the module, otherwise and under autograd), any
    other layer (a LoRA-wrapped one in training) called as it is."""
    if type(layer) is nn.Linear and layer.bias is None:
        return linear(x, layer.weight)
    return layer(x)


class RMSNorm(nn.Module):
    """y = weight * (x / rms(x)): normalised in fp32, scaled in x's dtype (as Qwen3's RMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = fastops.drafting_ops() if fastops.fused(x) and not torch.is_grad_enabled() and x.dtype == self.weight.dtype else None
        if fast is not None:  # one kernel that rounds as the two lines below do
            return fast.rms_norm(x, self.weight, self.eps, 0.0, cast_first=True)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope_type(scaling: Mapping[str, Any]) -> str:
    """The rotary kind a Hugging Face rope_scaling names ('default' when empty)."""
    return str(scaling.get("rope_type", scaling.get("type", "default"))) if scaling else "default"


class Rotary(nn.Module):
    """The drafter's rotary tables: plain, or scaled as Hugging Face's rope_scaling says (yarn, ...).

    Scaled kinds take their inverse frequencies and attention factor from transformers'
    `ROPE_INIT_FUNCTIONS`, the code DSpark checkpoints are trained and served with."""

    def __init__(self, head_dim: int, theta: float, scaling: Optional[Mapping[str, Any]] = None,
                 max_position_embeddings: int = 32768):
        super().__init__()
        scaling = dict(scaling or {})
        kind = rope_type(scaling)
        if kind == "default":
            inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            factor = 1.0
        else:
            from transformers import Qwen3Config
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            if kind not in ROPE_INIT_FUNCTIONS:
                raise ValueError(f"rope_scaling.rope_type {kind!r} is unknown; expected 'default' or one of "
                                 f"{sorted(ROPE_INIT_FUNCTIONS)}")
            hf = Qwen3Config(head_dim=head_dim, rope_theta=theta, max_position_embeddings=max_position_embeddings,
                             rope_scaling={**scaling, "rope_type": kind, "rope_theta": theta})
            inv, factor = ROPE_INIT_FUNCTIONS[kind](hf, torch.device("cpu"))
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        self.attention_factor = float(factor)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Integer `positions` [B, N] -> the tables `apply_rope` takes, [B, N, head_dim] in `dtype`: cos,
        and sin with its first half negated (the sign that rotate-half puts on x's second half, so each
        rotation needs no negation of its own)."""
        ang = positions.float().unsqueeze(-1) * self.inv_freq.to(positions.device)
        cos = (ang.cos() * self.attention_factor).to(dtype)
        sin = (ang.sin() * self.attention_factor).to(dtype)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def _rotary_ops(x: torch.Tensor, cos: torch.Tensor) -> Optional[fastops.DraftingOps]:
    """The drafting kernels where the rotary of x may run as one launch: drafting (no autograd) on CUDA,
    tables in x's dtype."""
    return fastops.drafting_ops() if fastops.fused(x) and not torch.is_grad_enabled() and cos.dtype == x.dtype else None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, N, hd] by `Rotary`'s tables [B, N, hd]: x cos + rotate_half(x) sin, where
    rotate_half(x) = [-x2, x1]; the sign lives in the table (x2 (-sin) and (-x2) sin are the same bits).
    Drafting on CUDA, one kernel that rounds as these torch ops do (`ready_kernels.rope`)."""
    fast = _rotary_ops(x, cos)
    if fast is not None:
        return fast.rope(x, cos, signed_sin)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.unsqueeze(1) + torch.cat([x2, x1], dim=-1) * signed_sin.unsqueeze(1)


class ContextAttention(nn.Module):
    """Multi-head (grouped-query) attention of the block over context K/V ++ block K/V."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def _normed(self, proj: nn.Linear, norm: RMSNorm, x: torch.Tensor, heads: int) -> torch.Tensor:
        """x [B, N, D] projected to `heads` heads, each normed -> [B, heads, N, hd] (one kernel for the norm
        and the rotation together was tried and removed: docs/kernels.md)."""
        B, N, _ = x.shape
        return norm(project(proj, x).view(B, N, heads, self.head_dim)).transpose(1, 2)

    def _values(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        return project(self.v_proj, x).view(B, N, self.num_kv_heads, self.head_dim).transpose(1, 2)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of x [B, N, D] -> two [B, H_kv, N, hd] (keys rotated)."""
        k = apply_rope(self._normed(self.k_proj, self.k_norm, x, self.num_kv_heads), cos, sin)
        return k, self._values(x)

    def store_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                 rows: torch.Tensor) -> None:
        """The keys and values of x [B, N, D], as `kv` gives them, written into the buffers
        [B, H_kv, cap, hd] at rows [1 or B, N] (`store_rotated`)."""
        store_rotated(self._normed(self.k_proj, self.k_norm, x, self.num_kv_heads), self._values(x), cos, sin,
                      k_buf, v_buf, rows)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                context_kv: Union[tuple[torch.Tensor, torch.Tensor], BufferedContext],
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        """x [B, N, D] block inputs; context_kv from `kv` of the context, or the static step's
        `BufferedContext`; mask [B, 1, N, T+N] bool or None (a BufferedContext carries its own)."""
        B, N, _ = x.shape
        q = apply_rope(self._normed(self.q_proj, self.q_norm, x, self.num_heads), cos, sin)
        gqa = self.num_heads != self.num_kv_heads
        if isinstance(context_kv, BufferedContext) and context_kv.split_kv is not None:
            self.store_kv(x, cos, sin, context_kv.k, context_kv.v, context_kv.rows)  # past the context
            o = context_kv.attend(q)
        elif isinstance(context_kv, BufferedContext):
            kb, vb = self.kv(x, cos, sin)
            o = context_kv.attend_masked(q, kb, vb, gqa)
        else:
            kb, vb = self.kv(x, cos, sin)
            k = torch.cat([context_kv[0], kb], dim=2)
            v = torch.cat([context_kv[1], vb], dim=2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return project(self.o_proj, o.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    """The draft layers' feed-forward: down(silu(gate(x)) * up(x)) (Hugging Face names)."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(self.down_proj, F.silu(project(self.gate_proj, x)) * project(self.up_proj, x))


class DraftLayer(nn.Module):
    """Pre-norm transformer layer whose attention also sees the target context."""

    def __init__(self, hidden: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = ContextAttention(hidden, num_heads, num_kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(hidden, intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                context_kv: Union[tuple[torch.Tensor, torch.Tensor], BufferedContext],
                mask: Optional[torch.Tensor] = None,
                pre: Optional[Hook] = None, post: Optional[Hook] = None) -> torch.Tensor:
        h = self.input_layernorm(x)
        if pre is not None:
            h = pre(h)
        x = x + self.self_attn(h, cos, sin, context_kv, mask)
        h = self.post_attention_layernorm(x)
        if post is not None:
            h = post(h)
        return x + self.mlp(h)
