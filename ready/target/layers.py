"""Building blocks of the Qwen3.5 text architecture; parameter names match Hugging Face checkpoints."""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ready import fastops
from ready.target.cache import GDNSlot, KVSlot
from ready.target.config import HybridConfig, TargetError
from ready.target.gdn_ops import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from ready_kernels import decode_attention, fused_gemv, gdn_fused, gdn_verify, small_m_gemm
from ready_kernels import exact_attention as exact_attention_op
from ready_kernels import row_norm as row_norm_op

# the tuned small-M linear of kernels/small_m_gemm.py (F.linear off CUDA or with autograd), and its
# residual form r + x W^T
linear, linear_add = small_m_gemm.small_m_linear, small_m_gemm.small_m_linear_add


# --- exact mode: every op of a verify pass gives a row the same bits whatever the number of rows ------
#
# `model.exact` (docs/interfaces.md "Exact mode"): verify(K+1) and the AR step (verify of 1 token)
# must produce bit-identical logits and states for the same token. So in exact mode every op that
# reduces or picks a kernel by shape goes through a path whose per-row result does not depend on
# the row count: the linears through `ready_kernels.small_m_gemm.exact_linear` (one Triton
# configuration per weight on CUDA, row-by-row F.linear on CPU), every norm through
# `ready_kernels.row_norm` (one program per row / a tree sum), attention through
# `ready_kernels.exact_attention` (one program per query row, keys walked from 0 in fixed blocks: a
# row's bits depend on its query and its keys 0..pos only, not on the static buffer's capacity, which
# differs between the AR and the speculative engine, nor on the row count), the causal conv as a
# fixed sum over its taps, and the GDN recurrence one token at a time (the fused kernel on CUDA, a
# tree-sum recurrence on CPU). Elementwise ops round the same in any shape, except that on
# CPU ATen's scalar tail loop can round transcendental functions differently from its vectorised
# body: `_elementwise` pads them so every element takes the vectorised body.


def exact_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return small_m_gemm.exact_linear(x, weight)


def row_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, offset: float = 0.0,
             mean: bool = True, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return row_norm_op.row_norm(x, weight, eps, offset, mean, out_dtype)


def lin(x: torch.Tensor, weight: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The target's bias-free projection: tuned small-M linear, or the row-invariant one in exact mode."""
    return exact_linear(x, weight) if exact else linear(x, weight)


_LANES = 128  # a multiple of twice every ATen CPU vector width (fp32 and 16-bit, AVX2 and AVX-512)


def _elementwise(fn, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """fn(x) for an elementwise fn. In exact mode on CPU the flattened tensor is zero-padded to a
    multiple of _LANES elements, so that every element goes through ATen's vectorised loop whatever
    the tensor's size (its scalar tail may round exp/sigmoid/... differently). Elsewhere: fn(x)."""
    if not exact or x.device.type != "cpu":
        return fn(x)
    flat = x.reshape(-1)
    n = flat.numel()
    return fn(F.pad(flat, (0, (-n) % _LANES)))[:n].view(x.shape)


def exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, n_keys: torch.Tensor,
                    window: Optional[int] = None) -> torch.Tensor:
    """Exact mode's attention: row t of q [B, H, T, hd] attends over keys 0..n_keys[t]-1 of the cache
    buffers [B, H_kv, L, hd] (only the last `window` of them with a sliding window), in fixed key
    blocks from 0 (`torch.ops.ready_kernels.exact_attention`: an
    opaque op, so torch.compile keeps it; Triton on CUDA, its row-invariant torch reference elsewhere)."""
    return exact_attention_op.exact_attention(q, keys, values, n_keys, window=window or 0)


def fuse_state_dict_names(module: nn.Module, fused: str, parts: list[tuple[str, int]]) -> None:
    """`module.<fused>` is one bias-free Linear whose rows are the Hugging Face projections `parts`
    ([(name, rows)], in order). Its state dict shows the parts under their own names (row views of
    the fused weight), and loading takes the parts and concatenates them, so checkpoints keep
    Hugging Face names while the forward runs one GEMM."""
    sizes = [n for _, n in parts]

    def save(mod, state, prefix, local_metadata):
        w = state.pop(prefix + fused + ".weight")
        for (name, _), piece in zip(parts, w.split(sizes)):
            state[prefix + name + ".weight"] = piece

    def load(mod, state, prefix, local_metadata, strict, missing, unexpected, errors):
        names = [prefix + name + ".weight" for name, _ in parts]
        if all(n in state for n in names):
            state[prefix + fused + ".weight"] = torch.cat([state.pop(n) for n in names])

    module._register_state_dict_hook(save)
    module._register_load_state_dict_pre_hook(load, with_module=True)


class RMSNorm(nn.Module):
    """Qwen3.5's zero-centred RMSNorm: y = x / rms(x) * (1 + weight), computed in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        if exact:
            return row_norm(x, self.weight, self.eps, offset=1.0, mean=True, out_dtype=x.dtype)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    """GDN output norm: RMSNorm (plain `weight`, initialised to one) times silu(gate)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor, exact: bool = False) -> torch.Tensor:
        dtype = x.dtype
        if exact:
            y = row_norm(x, None, self.eps, mean=True, out_dtype=dtype)
            return (self.weight * y * _elementwise(F.silu, gate.float(), True)).to(dtype)
        xf = x.float()
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (self.weight * y * F.silu(gate.float())).to(dtype)


class FusedMLP(nn.Module):
    """The target's SwiGLU with gate and up projections in one GEMM (`gate_up_proj`); state dicts
    keep the Hugging Face names gate_proj / up_proj / down_proj."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.inner = inner
        self.gate_up_proj = nn.Linear(hidden, 2 * inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        fuse_state_dict_names(self, "gate_up_proj", [("gate_proj", inner), ("up_proj", inner)])

    def forward(self, x: torch.Tensor, exact: bool = False, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The MLP of x; with `residual`, residual + MLP(x) (on the small-M path the add is down_proj's
        epilogue, rounded as the separate add rounds)."""
        gate, up = lin(x, self.gate_up_proj.weight, exact).split(self.inner, dim=-1)
        inner = _elementwise(F.silu, gate, exact) * up
        if residual is not None and not exact:
            return linear_add(inner, self.down_proj.weight, residual)
        y = lin(inner, self.down_proj.weight, exact)
        return y if residual is None else residual + y


def rotary(positions: torch.Tensor, rot_dim: int, theta: float, dtype: torch.dtype,
           exact: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, rot_dim] for the rotated part of each head (partial rotary)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, device=positions.device, dtype=torch.float32) / rot_dim))
    freqs = positions.float()[:, None] * inv_freq[None]
    emb = torch.cat([freqs, freqs], dim=-1)
    return _elementwise(torch.cos, emb, exact).to(dtype), _elementwise(torch.sin, emb, exact).to(dtype)


# A pass's rotary inputs, shared by its attention layers: positions [T] (or [B, T], one row per sequence of
# a ragged batch), cos and sin [T, rot_dim] (or [B, 1, T, rot_dim])
Rope = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def rope_base(start: int, cache: Optional[KVSlot]) -> torch.Tensor | int:
    """Where a pass's positions start: a static cache's device counter (CUDA graphs; [B] per row in a
    ragged cache), else `start`."""
    return cache.length_t if cache is not None and cache.static else start


def pass_rope(base: torch.Tensor | int, T: int, rot_dim: int, theta: float, dtype: torch.dtype,
              device: torch.device, exact: bool = False) -> Rope:
    """Positions base + 0..T-1 (`base`: a static cache's device counter, one per row [B] in a ragged cache,
    or the committed length) with their cos / sin, computed once per pass: inside every layer's fused
    kernels the transcendentals lengthened the 27B verify (the H200 A/B "rotary inputs once per pass", in
    git: `git show a56215a:docs/benchmarks.md`)."""
    steps = torch.arange(T, device=device)
    if isinstance(base, torch.Tensor) and base.dim() == 1:  # per-row lengths: positions [B, T]
        pos = base[:, None] + steps
        cos, sin = rotary(pos.reshape(-1), rot_dim, theta, dtype, exact)
        shape = (pos.shape[0], 1, T, cos.shape[-1])
        return pos, cos.view(shape), sin.view(shape)
    pos = base + steps
    cos, sin = rotary(pos, rot_dim, theta, dtype, exact)
    return pos, cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd]: rotate the first rot_dim channels, pass the rest through."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr[..., : r // 2], xr[..., r // 2 :]
    rot = torch.cat([-x2, x1], dim=-1)
    return torch.cat([xr * cos + rot * sin, xp], dim=-1)


def visible_keys(pos: torch.Tensor, n_keys: int, window: Optional[int] = None) -> torch.Tensor:
    """Bool [..., T, n_keys]: the query at absolute position pos[..., t] sees key j when j <= pos
    (causal) and, with a sliding window W (`HybridConfig.sliding_window`), when pos - j < W."""
    j = torch.arange(n_keys, device=pos.device)
    seen = j <= pos[..., None]
    if window:
        seen &= j > pos[..., None] - window
    return seen


class Attention(nn.Module):
    """Gated full attention: q/k RMSNorm per head, partial RoPE, GQA, sigmoid output gate; over the
    whole prefix, or its last `window` keys when the config sets a sliding window."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.rot_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        self.window: Optional[int] = cfg.sliding_window  # None = every earlier key (Qwen3.5)
        # q (with its output gate), k and v in one GEMM; state dicts say q_proj, k_proj, v_proj
        self.split = [self.n_heads * self.hd * 2, self.n_kv * self.hd, self.n_kv * self.hd]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        fuse_state_dict_names(self, "qkv_proj", list(zip(("q_proj", "k_proj", "v_proj"), self.split)))

    def project(self, x: torch.Tensor, exact: bool = False) -> tuple[torch.Tensor, ...]:
        """q, k, v [B, H, T, hd] (q and k normed, before rotary) and the output gate [B, T, H*hd]."""
        B, T, _ = x.shape
        qg, k, v = lin(x, self.qkv_proj.weight, exact).split(self.split, dim=-1)
        q, gate = qg.reshape(B, T, self.n_heads, 2 * self.hd).chunk(2, dim=-1)
        q = self.q_norm(q, exact).transpose(1, 2)
        k = self.k_norm(k.reshape(B, T, self.n_kv, self.hd), exact).transpose(1, 2)
        v = v.reshape(B, T, self.n_kv, self.hd).transpose(1, 2)
        return q, k, v, gate.reshape(B, T, -1)

    def forward(self, x: torch.Tensor, start: int, cache: Optional[KVSlot] = None, exact: bool = False,
                rope: Optional[Rope] = None) -> torch.Tensor:
        q, k, v, gate = self.project(x, exact)
        return self.gate_out(self.mix(q, k, v, start, cache, exact, rope), gate, exact)

    def mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, cache: Optional[KVSlot] = None,
            exact: bool = False, rope: Optional[Rope] = None) -> torch.Tensor:
        """Rotary, the cache write and attention: the output [B, H, T, hd] before its gate and o_proj.
        `rope`: the pass's positions, cos and sin (`HybridLM` computes them once for every layer)."""
        T, device = q.shape[2], q.device
        if rope is None:
            rope = pass_rope(rope_base(start, cache), T, self.rot_dim, self.cfg.rope_theta, q.dtype, device, exact)
        pos, cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is None:  # training / teacher forcing: this chunk's keys only
            if self.window:
                mask = visible_keys(torch.arange(T, device=device), T, self.window)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if cache.static:  # fixed shapes: write at device positions, attend over the whole buffer
            if pos.dim() == 2:  # a ragged batch: row b at its own positions (past the buffer: its last slot,
                # beyond every live row's committed length)
                B, L = q.shape[0], cache.key.shape[2]
                idx = pos.clamp(max=L - 1)[:, None, :, None].expand(B, self.n_kv, T, self.hd)
                cache.key.scatter_(2, idx, k)
                cache.value.scatter_(2, idx, v)
            else:
                cache.key.index_copy_(2, pos, k)
                cache.value.index_copy_(2, pos, v)
            return self.attention(q, cache.key, cache.value, pos, exact)
        cache.key[:, :, start : start + T] = k
        cache.value[:, :, start : start + T] = v
        if exact:  # the whole buffer: exact attention reads keys 0..pos only, whatever the capacity
            return self.attention(q, cache.key, cache.value, pos, exact)
        return self.attention(q, cache.key[:, :, : start + T], cache.value[:, :, : start + T], pos, exact)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
               gate: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """`attention`, gated and projected."""
        return self.gate_out(self.attention(q, keys, values, pos, exact), gate, exact)

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
                  exact: bool = False) -> torch.Tensor:
        """The queries q [B, H, T, hd] at absolute positions pos ([T], or [B, T] per row: the ragged
        batch) over the cache buffers keys/values [B, H_kv, L, hd], where key j sits at position j:
        a query at p sees keys 0..p (the last `window` of them with a window). Output [B, H, T, hd]."""
        if exact:  # fixed key-block order over keys 0..p: the same bits whatever the buffer or T
            return exact_attention(q, keys, values, pos + 1, self.window)
        split_kv = split_kv_attention(q.dtype, q.device, self.n_heads, self.n_kv, q.shape[2])
        if split_kv is not None:
            # decode / verify queries: split over key blocks (kernels/decode_attention.py), not SDPA's prefill tiles
            return split_kv(q, keys, values, pos, self.window or 0)
        mask = visible_keys(pos, keys.shape[2], self.window)  # [T, L] or [B, T, L]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask if mask.dim() == 2 else mask[:, None],
                                              enable_gqa=True)

    def gate_out(self, out: torch.Tensor, gate: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The attention output [B, H, T, hd] times its sigmoid gate, through o_proj."""
        return lin(self.gated(out, gate, exact), self.o_proj.weight, exact)

    def gated(self, out: torch.Tensor, gate: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The attention output [B, H, T, hd] times its sigmoid gate: o_proj's input [B, T, H*hd]."""
        B, _, T, _ = out.shape
        return out.transpose(1, 2).reshape(B, T, -1) * _elementwise(torch.sigmoid, gate, exact)


def _fla_chunk():
    """flash-linear-attention's chunked GDN (an optional GPU extra), or None."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk  # type: ignore
    except Exception:
        return None
    return fla_chunk


FLA_CHUNK = _fla_chunk()
# The kernels the target calls where `fastops.fused` says Triton runs: the verify's recurrence and the
# commit's replay, the fused verify (one launch) and the two-pass verify (fronts, then recurrence), the
# 16-bit fast path's split-key attention (kernels/decode_attention.py) and the AR step's fused GEMV. A
# name set to None turns that kernel off (tests compare a path against the torch ops so).
GDN_VERIFY_KERNEL, GDN_COMMIT_KERNEL = gdn_verify.gdn_verify, gdn_verify.gdn_commit
GDN_FUSED_KERNEL, GDN_TWO_PASS_KERNEL = gdn_fused.gdn_fused_verify, gdn_fused.gdn_two_pass_verify
DECODE_ATTENTION = decode_attention
SplitKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def split_kv_attention(dtype: torch.dtype, device: torch.device, num_heads: int, num_kv_heads: int,
                       queries: int) -> Optional[SplitKV]:
    """kernels/decode_attention.py's split-key attention where it serves `queries` query positions: 16-bit
    CUDA, one KV head's query rows within its tile. None elsewhere (SDPA). The target's cached attention
    and the drafter's fixed-shape draft steps both ask here."""
    if (DECODE_ATTENTION is None or not fastops.fused_on(device) or dtype == torch.float32
            or not DECODE_ATTENTION.fits(num_heads, num_kv_heads, queries)):
        return None
    return DECODE_ATTENTION.decode_attention


@functools.lru_cache(maxsize=None)
def fla_backward_trusted(device: torch.device) -> bool:
    """False where fla's chunked GDN backward is known to give wrong gradients: Hopper (sm_90) with
    Triton 3.4.0 to 3.7.0 miscompiles `chunk_bwd_dqkwg` (fla-org/flash-linear-attention#640; fla
    releases since mid-2026 raise there, older ones train on wrong db/dg). Training takes the torch path then."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return True
    try:
        import triton

        parts = (triton.__version__.split("+")[0].split(".") + ["0", "0"])[:3]
        version = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts)
    except Exception:
        return False
    return not ((3, 4, 0) <= version < (3, 7, 1))


def fla_chunk_for(q: torch.Tensor, state_positions: Optional[torch.Tensor]) -> Optional[Callable]:
    """fla's chunked GDN where it is a faithful fast path, else None (our torch chunked form runs).
    `q`: the layer's activations in the model's dtype (the conv's output), before any float32 cast.

    Only for 16-bit CUDA models: fla's Triton dots take float32 inputs in TF32, so a float32 target
    would prefill ~1e-3 away from its own verify and fail the float32 tie margin (TIE_REL) that the
    lossless checks hold it to. Never with `state_positions` (fla returns only the final state), nor
    where a backward follows on a device whose fla backward is not trusted (`fla_backward_trusted`)."""
    if FLA_CHUNK is None or not fastops.fused(q) or q.dtype not in (torch.bfloat16, torch.float16):
        return None
    if state_positions is not None or (q.requires_grad and not fla_backward_trusted(q.device)):
        return None
    return FLA_CHUNK


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet token mixer: causal depthwise conv on q/k/v, L2-normalised q/k, decay
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), grouped value heads, gated norm."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.nk, self.nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.kernel = cfg.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        # in_proj_qkv, in_proj_z, in_proj_b and in_proj_a read the same input: one GEMM, HF names in state dicts
        self.split = [self.conv_dim, self.value_dim, self.nv, self.nv]
        self.in_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False, padding=self.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.empty(self.nv).uniform_(1.0, 16.0).log())
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        fuse_state_dict_names(self, "in_proj", list(zip(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), self.split)))

    def _conv(self, mixed: torch.Tensor, prefix: Optional[torch.Tensor],
              exact: bool = False, taps: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv over [B, T, conv_dim]; returns silu(conv) and the padded input.
        `taps` (the verify pass, a few tokens): a float32 sum over the kernel's taps, which
        torch.compile fuses with its neighbours instead of launching a cuDNN conv per layer.
        Exact mode: the same tap sum, with exact mode's padded silu (F.conv1d picks its algorithm
        by shape)."""
        x = mixed.transpose(1, 2)
        w = self.kernel - 1
        full = F.pad(x, (w, 0)) if prefix is None else torch.cat([prefix.to(x.dtype), x], dim=-1)
        if exact or taps:
            T, weight = x.shape[-1], self.conv1d.weight[:, 0].float()  # [C, kernel]
            acc = full[..., 0:T].float() * weight[:, 0:1]
            for j in range(1, self.kernel):
                acc = acc + full[..., j:j + T].float() * weight[:, j:j + 1]
            return _elementwise(F.silu, acc.to(x.dtype), exact).transpose(1, 2), full
        y = F.conv1d(full, self.conv1d.weight, groups=self.conv_dim)
        return F.silu(y).transpose(1, 2), full

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k [B, T, H_v, d_k] (key heads repeated to the value heads) and v [B, T, H_v, d_v], in qkv's dtype."""
        B, T, _ = qkv.shape
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.nv // self.nk
        q = q.reshape(B, T, self.nk, self.dk).repeat_interleave(rep, dim=2)
        k = k.reshape(B, T, self.nk, self.dk).repeat_interleave(rep, dim=2)
        return q, k, v.reshape(B, T, self.nv, self.dv)

    def _decay(self, a: torch.Tensor) -> torch.Tensor:
        """The log-decay g = -exp(A_log) softplus(a + dt_bias), float32."""
        return -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())

    def _heads(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, exact: bool = False):
        q, k, v = self._split(qkv)
        if exact:
            q = row_norm(q.float(), None, 1e-6, mean=False) * self.dk**-0.5
            k = row_norm(k.float(), None, 1e-6, mean=False)
            beta = _elementwise(torch.sigmoid, b.float(), True)
            g = -self.A_log.float().exp() * _elementwise(F.softplus, a.float() + self.dt_bias.float(), True)
        else:
            q = l2norm(q.float()) * self.dk**-0.5
            k = l2norm(k.float())
            beta = b.float().sigmoid()
            g = self._decay(a)
        # head-major, fp32: [B, H, T, d]
        return q.transpose(1, 2), k.transpose(1, 2), v.float().transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2)

    def _fla_chunk(self, fla: Callable, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                   init: Optional[torch.Tensor], live: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunked rule through flash-linear-attention, called as transformers' Qwen3.5 calls it: q, k, v
        in the model's 16-bit dtype (key heads repeated to the value heads), q and k L2-normalised inside
        the kernel, float32 log-decay g, beta in the model dtype. `live` [B, T]: a right-padded prefill's
        own tokens (g and beta 0 elsewhere). Returns o [B, H_v, T, d_v] and the final state [B, H_v, d_k, d_v]
        (float32)."""
        q, k, v = self._split(mixed)
        g, beta = self._decay(a), b.sigmoid()
        if live is not None:
            g, beta = g * live[..., None], beta * live[..., None]
        o, final = fla(q, k, v, g, beta, scale=self.dk**-0.5,
                       initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return o.transpose(1, 2), final

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised queries [B, H_v, T, d_k] (fp32, before the d_k^-0.5 scale, key heads
        repeated to the value heads) a full pass over x [B, T, hidden] (this layer's normed input)
        reads its states with: the span of the target's own queries (benchmarks.diagnostics.query_span)."""
        qkv, _, b, a = lin(x, self.in_proj.weight).split(self.split, dim=-1)
        q = self._heads(self._conv(qkv, None)[0], b, a)[0]
        return q * self.dk**0.5

    def _output(self, o: torch.Tensor, z: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The outputs o [B, H, T, dv] through the gated norm and out_proj."""
        return lin(self.gated_norm(o.transpose(1, 2), z, exact), self.out_proj.weight, exact)

    def gated_norm(self, o: torch.Tensor, z: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The outputs o [B, T, H, dv] normed per head and gated by z: out_proj's input [B, T, H*dv]."""
        B, T, _ = z.shape
        return self.norm(o.to(z.dtype), z.reshape(B, T, self.nv, self.dv), exact).reshape(B, T, -1)

    def fused_verify(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, cache: GDNSlot) -> torch.Tensor:
        """The verify pass's conv, SiLU, norms, gates and recurrence (kernels/gdn_fused.py): each token's
        window into cache.pending_conv and its replay inputs into cache.pending_inputs (or, where the cache
        keeps states, its state into cache.pending_states); returns the outputs [B, T, H, dv] (float32).
        One launch for the AR step; a block of T > 1 tokens computes every token's front at once and then
        runs only the recurrence serially (two launches), where the one launch's serial loop over the
        fronts made a block cost several times the AR step's launch (docs/figures.md)."""
        T = qkv.shape[1]
        kept = cache.pending_states is not None
        if T > 1 and not kept and GDN_TWO_PASS_KERNEL is not None:
            o, _, _ = GDN_TWO_PASS_KERNEL(qkv, b, a, cache.conv, self.conv1d.weight[:, 0], self.A_log, self.dt_bias,
                                          cache.ssm, self.nk, self.dk, cache.pending_inputs[:, :T],
                                          out_windows=cache.pending_conv[:, :T])
            return o
        o, _, _ = GDN_FUSED_KERNEL(qkv, b, a, cache.conv, self.conv1d.weight[:, 0], self.A_log, self.dt_bias,
                                   cache.ssm, self.nk, self.dk, out_windows=cache.pending_conv[:, :T],
                                   out_states=cache.pending_states[:T].transpose(0, 1) if kept else None,
                                   out_inputs=None if kept else cache.pending_inputs[:, :T])
        return o

    def forward(
        self,
        x: torch.Tensor,
        mode: str = "full",
        cache: Optional[GDNSlot] = None,
        state_positions: Optional[torch.Tensor] = None,
        exact: bool = False,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """mode: `full` (no cache), `prefill` (append to the committed state and commit),
        `verify` (per-token inputs and windows into cache.pending_*, live state untouched). `exact`: the
        row-invariant ops (module comment above), for verify."""
        prefix = None if cache is None else cache.conv
        qkv, z, b, a = lin(x, self.in_proj.weight, exact).split(self.split, dim=-1)
        if mode == "verify" and not exact and GDN_FUSED_KERNEL is not None and fastops.fused(x):
            return self._output(self.fused_verify(qkv, b, a, cache).transpose(1, 2), z, exact), None
        mixed, full = self._conv(qkv, prefix, exact, taps=mode == "verify")
        init = None if cache is None else cache.ssm
        at = None
        fla = None if mode == "verify" else fla_chunk_for(mixed, state_positions)
        live = None  # a right-padded prefill: [B, T] True on each row's own tokens
        if mode == "prefill" and cache.ends is not None:
            live = torch.arange(x.shape[1], device=x.device) < cache.ends[:, None]
        if fla is not None:
            o, final = self._fla_chunk(fla, mixed, b, a, init, live)
        else:
            q, k, v, g, beta = self._heads(mixed, b, a, exact)
            if live is not None:  # a pad token neither decays the state (g = 0) nor writes to it (beta = 0)
                g, beta = g * live[:, None], beta * live[:, None]
        if mode == "verify":
            T = x.shape[1]
            states = None if cache.pending_states is None else cache.pending_states[:T]
            o = _verify_outputs(q, k, v, g, beta, init, cache.pending_inputs[:, :T], exact, states)
            windows = full.unfold(-1, self.kernel - 1, 1)[:, :, 1:]  # window after each token
            cache.pending_conv[:, :T] = windows.permute(0, 2, 1, 3)
        else:
            if fla is None:
                o, final, at = chunk_gated_delta_rule(q, k, v, g, beta, init, state_positions=state_positions)
            if mode == "prefill":
                cache.ssm.copy_(final)
                w = self.kernel - 1
                if live is None:
                    cache.conv.copy_(full[:, :, -w:])
                else:  # the last w inputs up to each row's end (`full` starts with the w-wide prefix)
                    at = (cache.ends[:, None] + torch.arange(w, device=x.device))[:, None].expand(-1, full.shape[1], -1)
                    cache.conv.copy_(full.gather(2, at))
        return self._output(o, z, exact), at


def verify_rule(device: torch.device, exact: bool) -> str:
    """The token step a verify pass runs on `device`, which the commit must replay with the same
    arithmetic: `kernel` (the Triton kernels' step, CUDA), `exact` (`_exact_recurrence`) or `torch`
    (`recurrent_gated_delta_rule`)."""
    if GDN_COMMIT_KERNEL is not None and fastops.fused_on(device):
        if (not exact and GDN_FUSED_KERNEL is not None) or GDN_VERIFY_KERNEL is not None:
            return "kernel"
    return "exact" if exact else "torch"


def keeps_verify_states(device: torch.device) -> bool:
    """Whether a cache on `device` must keep the GDN state after every verified token: wherever a
    verify or its commit has no Triton kernel, the commit installs a kept state instead of replaying."""
    return verify_rule(device, False) != "kernel" or verify_rule(device, True) != "kernel"


def _verify_outputs(q, k, v, g, beta, init, out_inputs: torch.Tensor, exact: bool = False,
                    out_states: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Outputs [B,H,T,dv] of the recurrence over the verified tokens (head-major fp32 inputs); writes each
    token's replay inputs [k | v | g | beta] into out_inputs [B,T,H,dk+dv+2] for the commit's kernel and,
    where the commit has none, the state after each token into out_states [T,B,H,dk,dv]. On CUDA the
    Triton kernel runs the recurrence (kernels/gdn_verify.py); its token step is one fixed sequence of
    operations whatever T, so it serves exact mode too. Elsewhere, exact mode runs `_exact_recurrence`."""
    out_inputs.copy_(torch.cat([k, v, g[..., None], beta[..., None]], dim=-1).transpose(1, 2))
    rule = verify_rule(q.device, exact)
    if rule == "kernel":
        t = lambda a: a.transpose(1, 2)  # noqa: E731  (the kernel takes strided views)
        o, _ = GDN_VERIFY_KERNEL(t(q), t(k), t(v), t(g), t(beta), init, 1.0, keep_states=False)
        return o.transpose(1, 2)
    if rule == "exact":
        return _exact_recurrence(q, k, v, g, beta, init, out_states)
    return recurrent_gated_delta_rule(q, k, v, g, beta, init, out_states)[0]


def commit_gdn(ssm: torch.Tensor, conv: torch.Tensor, pending_inputs: torch.Tensor, pending_conv: torch.Tensor,
               n: int | torch.Tensor, exact: bool = False, pending_states: Optional[torch.Tensor] = None) -> None:
    """Install the GDN states and conv windows after the first n verified tokens (an int, or an integer
    tensor [B] per row) into the live cache tensors [L, B, ...]. With the Triton kernels: the verify's
    token step replayed from the live states over the kept tokens' inputs (the bits the verify's chain
    had); elsewhere the state the verify kept after token n (`pending_states` [L, T, B, ...])."""
    if verify_rule(ssm.device, exact) == "kernel":  # one launch over every layer
        GDN_COMMIT_KERNEL(ssm, pending_inputs, n, conv, pending_conv)
        return
    if pending_states is None:
        raise TargetError("commit without kept GDN states: this cache was allocated with keep_states=False, "
                         f"but a verify on {ssm.device} in {'exact' if exact else 'default'} mode has no replay "
                         "kernel; allocate it through the model (new_cache) or with keep_states=True")
    B = ssm.shape[1]
    counts = n.to(ssm.device).long() if isinstance(n, torch.Tensor) else torch.full((B,), int(n), device=ssm.device)
    rows = torch.arange(B, device=ssm.device)
    ssm.copy_(pending_states[:, counts - 1, rows])
    conv.copy_(pending_conv[:, rows, counts - 1])


def _exact_recurrence(q, k, v, g, beta, init, out_states: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The gated delta rule one token at a time on same-shaped contiguous slices, with tree sums
    over d_k: token t's arithmetic is the same whatever T (head-major inputs as in
    `recurrent_gated_delta_rule`; float32). Writes the state after every token into out_states
    [T, B, H, dk, dv] when given (what the commit installs)."""
    tree_sum = row_norm_op.tree_sum
    B, H, T, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if init is None else init.float()
    outs = []
    for t in range(T):
        qt, kt, vt = q[:, :, t].contiguous(), k[:, :, t].contiguous(), v[:, :, t].contiguous()
        decay = _elementwise(torch.exp, g[:, :, t].contiguous(), True)
        S = S * decay[..., None, None]
        sk = tree_sum((S * kt[..., :, None]).transpose(-1, -2))[..., 0]  # S^T k  [B, H, dv]
        delta = (vt - sk) * beta[:, :, t].contiguous()[..., None]
        S = S + kt[..., :, None] * delta[..., None, :]
        outs.append(tree_sum((S * qt[..., :, None]).transpose(-1, -2))[..., 0])  # S^T q
        if out_states is not None:
            out_states[t] = S
    return torch.stack(outs, dim=2)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, layer_id: int):
        super().__init__()
        self.layer_type = cfg.layer_types[layer_id]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = FusedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# kernels/fused_gemv.py: the AR step's projections with the post-attention norm and the residual adds
# folded in (None: off, as for the kernels above)
FUSED_GEMV = fused_gemv


def fuses_decode(layer: DecoderLayer, x: torch.Tensor, mode: str, cache: Optional[GDNSlot | KVSlot],
                 exact: bool = False) -> bool:
    """Whether `decoder_layer_forward` runs `fused_decode_layer`: the AR step (a verify pass of one
    token of one row) on the 16-bit CUDA fast path, without autograd."""
    if FUSED_GEMV is None or exact or mode != "verify" or cache is None or not fastops.fused(x):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or x.shape[0] * x.shape[1] != 1:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or layer.mlp.down_proj.weight.requires_grad):
        return False
    return layer.layer_type != "linear_attention" or GDN_FUSED_KERNEL is not None


def fused_decode_layer(layer: DecoderLayer, x: torch.Tensor, cache: GDNSlot | KVSlot, start: int,
                       rope: Optional[Rope] = None) -> torch.Tensor:
    """One decoder block of the AR step with two of its small kernels folded into projections
    (kernels/fused_gemv.py): the residual add after the token mixer goes into o_proj / out_proj's
    epilogue and the post-attention RMSNorm into gate_up's prologue (one kernel before), the residual
    add after the MLP into down_proj's epilogue. Same arithmetic as the unfused block, except that
    the MLP's normed input is not rounded to 16 bits. Why, and what was dropped: docs/kernels.md "Fused
    GEMV"; its figures: docs/figures.md "Kernels"."""
    gemv = FUSED_GEMV.fused_gemv
    h = layer.input_layernorm(x)
    if layer.layer_type == "linear_attention":
        m = layer.linear_attn
        qkv, z, b, a = lin(h, m.in_proj.weight).split(m.split, dim=-1)
        x = gemv(m.gated_norm(m.fused_verify(qkv, b, a, cache), z), m.out_proj.weight, residual=x)
    else:
        m = layer.self_attn
        q, k, v, gate = m.project(h)
        x = gemv(m.gated(m.mix(q, k, v, start, cache, rope=rope), gate), m.o_proj.weight, residual=x)
    post = layer.post_attention_layernorm
    g, u = gemv(x, layer.mlp.gate_up_proj.weight, post.weight, eps=post.eps).split(layer.mlp.inner, dim=-1)
    return gemv(F.silu(g) * u, layer.mlp.down_proj.weight, residual=x)


def decoder_layer_forward(
    layer: DecoderLayer,
    x: torch.Tensor,
    mode: str,
    cache: Optional[GDNSlot | KVSlot],
    start: int,
    state_positions: Optional[torch.Tensor],
    exact: bool = False,
    rope: Optional[Rope] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One pre-norm residual block: token mixer (GDN or attention), then the MLP. `exact`: the
    row-invariant ops of exact mode (see the comment at the top of this module). `rope`: the pass's
    rotary inputs (attention layers; computed here when None). The AR step on the 16-bit CUDA fast
    path runs `fused_decode_layer`."""
    if fuses_decode(layer, x, mode, cache, exact):
        return fused_decode_layer(layer, x, cache, start, rope), None
    h = layer.input_layernorm(x, exact)
    at = None
    if layer.layer_type == "linear_attention":
        h, at = layer.linear_attn(h, mode, cache, state_positions, exact)
    else:
        h = layer.self_attn(h, start, cache, exact, rope)
    x = x + h
    return layer.mlp(layer.post_attention_layernorm(x, exact), exact, residual=x), at


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Hugging Face-style init (normal(0, std) for projections and embeddings)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, nn.Conv1d):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5))
