"""Decode / verify attention with a fixed key-block order (the target's exact mode, issue 18).

For every (batch row b, query head h, query row t), with n = n_keys[b, t] valid keys:

    o[b, h, t] = softmax(scale * q[b, h, t] . k[b, h // G, j]  for lo <= j < n) @ v[b, h // G, lo:n]

with lo = 0, or lo = max(n - window, 0) for a sliding window (a target pretrained with attention over
its last `window` keys only: `HybridConfig.sliding_window`). Key blocks stay aligned to multiples of
BLOCK_N from key 0; a window only skips the blocks wholly before lo, so the bits still depend on the
row's own keys only.
(G = query heads per KV head, GQA; scale = head_dim^-0.5 unless given). The keys and values are the
whole cache buffer [B, H_kv, L, d]; only the first n positions of a row are read, so what lies past
them (a longer static buffer, stale keys of rejected tokens) never matters.

The point is what the result does NOT depend on. A row's output is a function of its query, its n
keys and values, and nothing else: not the buffer capacity L, not how many query rows share the call
(the AR step has 1, verify K+1), not the batch. So the AR engine and the speculative engine, whose
static caches have different capacities, and verify(K+1) vs the step, all give a token the same bits.
(PyTorch SDPA over a masked buffer does not promise that: its backend and its split of the key axis
may follow L.)

- `exact_attention_triton`: one program per (b, h, t). It reads n from a device tensor (no host
  sync, static shapes: CUDA-graph capturable), then walks the keys from 0 in blocks of a FIXED
  BLOCK_N with a float32 online softmax (running max, running sum, rescaled accumulator). Block size,
  warp count and the tile layout depend on the head dims only; every integer argument that varies
  with L, T or the batch is kept out of Triton's specialisation, and the head/batch offsets are
  multiples of the head dim, so the compiled kernel (and so the reduction order) is one and the same
  for every call of a model.
- `exact_attention_reference`: plain torch, the same math, and itself row- and capacity-invariant on
  any device: the dot products and block sums are pairwise trees of elementwise adds
  (`row_norm.tree_sum`), exp runs on tensors padded to whole vector lanes, and it walks every block
  of the buffer, where a block past a row's n keys is an exact no-op (rescale by exp(0) = 1, add 0).
- `exact_attention`: dispatch, Triton on CUDA, the reference elsewhere;
  `torch.ops.ready_kernels.exact_attention` is the same as an opaque custom op (torch.compile must not
  re-tile it).

The two implementations agree to float32 rounding, not bit for bit: exactness is a property of each
path against itself, across buffer capacities and row counts. Inference only (no autograd).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton
from .row_norm import tree_sum

BLOCK_N = 32  # keys per block: fixed, never chosen from the buffer length or the row count
MAX_HEAD_DIM = 256
NUM_WARPS = 4
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if HAS_TRITON:
    import triton
    import triton.language as tl

    # Everything that varies with the buffer capacity L, the row count T or the batch stays a plain
    # runtime value: a specialised int (== 1, divisible by 16) would compile another kernel, whose
    # tiles could reduce in another order. n_keys may be a view at any offset (a scalar load: its
    # alignment must not pick another kernel either); q and o are fresh, k and v checked (_rows_layout).
    @triton.jit(do_not_specialize=["HQ", "GROUP", "T", "L", "WINDOW", "k_b", "k_h", "v_b", "v_h", "n_b", "n_t"],
                do_not_specialize_on_alignment=["n_ptr"])
    def _exact_attention_kernel(q_ptr, k_ptr, v_ptr, n_ptr, o_ptr,
                                k_b, k_h, v_b, v_h, n_b, n_t,
                                HQ, GROUP, T, L, WINDOW, scale,
                                D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per (b * HQ + h, t). q and o are contiguous [B, HQ, T, D|DV]; k/v rows are
        contiguous, their batch and head strides given in rows (k_b, k_h: multiples of D elements)."""
        pid = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        b = (pid // HQ).to(tl.int64)
        h = (pid % HQ).to(tl.int64)
        hk = h // GROUP
        n = tl.load(n_ptr + b * n_b + t * n_t).to(tl.int32)
        n = tl.minimum(tl.maximum(n, 0), L)  # never read past the buffer, whatever n says
        lo = tl.where(WINDOW > 0, tl.maximum(n - WINDOW, 0), 0)  # first key seen

        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < D
        mask_dv = offs_dv < DV
        row = (b * HQ + h) * T + t
        q = tl.load(q_ptr + row * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        k_base = k_ptr + (b * k_b + hk * k_h) * D
        v_base = v_ptr + (b * v_b + hk * v_h) * DV

        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
        for start in range((lo // BLOCK_N) * BLOCK_N, n, BLOCK_N):  # aligned blocks, in order; key lo keeps m finite
            keys = start + offs_n
            valid = (keys < n) & (keys >= lo)
            kt = tl.load(k_base + keys[:, None] * D + offs_d[None, :], mask=valid[:, None] & mask_d[None, :],
                         other=0.0).to(tl.float32)
            s = tl.sum(kt * q[None, :], 1) * scale
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            vt = tl.load(v_base + keys[:, None] * DV + offs_dv[None, :], mask=valid[:, None] & mask_dv[None, :],
                         other=0.0).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = acc * alpha + tl.sum(p[:, None] * vt, 0)
            m_i = m_new
        out = tl.where(l_i > 0, acc / tl.maximum(l_i, 1e-30), 0.0)  # n = 0: zeros
        tl.store(o_ptr + row * DV + offs_dv, out.to(o_ptr.dtype.element_ty), mask=mask_dv)


def check_attention_inputs(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, per_row: torch.Tensor,
                           per_row_name: str, window: int = 0) -> torch.Tensor:
    """Validate the inputs of a cached-attention op `op` (this module's and decode_attention's); returns
    `per_row` (n_keys or pos: integer [T] or [B, T]) as [B, T], a [T] tensor shared by every batch row."""
    require(q.dim() == 4, f"{op}: q must be [B, H_q, T, d], got {tuple(q.shape)}")
    B, HQ, T, D = q.shape
    require(k.dim() == 4 and k.shape[0] == B and k.shape[3] == D,
            f"{op}: k must be [B={B}, H_kv, L, d={D}], got {tuple(k.shape)}")
    HKV, L = k.shape[1], k.shape[2]
    require(v.dim() == 4 and tuple(v.shape[:3]) == (B, HKV, L),
            f"{op}: v must be [B={B}, H_kv={HKV}, L={L}, d_v], got {tuple(v.shape)}")
    require(HKV > 0 and HQ % HKV == 0, f"{op}: query heads ({HQ}) must be a multiple of KV heads ({HKV})")
    require(0 < D <= MAX_HEAD_DIM and 0 < v.shape[3] <= MAX_HEAD_DIM,
            f"{op}: head dims must be 1..{MAX_HEAD_DIM}, got d={D}, d_v={v.shape[3]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.dtype in _DTYPES, f"{op}: {name} must be float32, bfloat16 or float16, got {t.dtype}")
    require(not per_row.is_floating_point() and per_row.dtype != torch.bool,
            f"{op}: {per_row_name} must be an integer tensor, got {per_row.dtype}")
    shape_msg = f"{op}: {per_row_name} must be [T={T}] or [B={B}, T={T}], got {tuple(per_row.shape)}"
    if per_row.dim() == 1:
        require(per_row.shape[0] == T, shape_msg)
        per_row = per_row[None].expand(B, T)
    require(tuple(per_row.shape) == (B, T), shape_msg)
    require(int(window) >= 0, f"{op}: window must be >= 0 (0 = every key), got {window}")
    devs = {t.device for t in (q, k, v, per_row)}
    require(len(devs) == 1, f"{op}: all inputs must be on one device, got {sorted(map(str, devs))}")
    return per_row


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor, window: int = 0) -> torch.Tensor:
    return check_attention_inputs("exact_attention", q, k, v, n_keys, "n_keys", window)


def _padded_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x); on CPU over the flattened tensor zero-padded to whole 128-element lanes, so that every
    element takes ATen's vectorised loop (its scalar tail may round exp differently) whatever the shape."""
    if x.device.type != "cpu":
        return torch.exp(x)
    flat = x.reshape(-1)
    n = flat.numel()
    return torch.exp(F.pad(flat, (0, (-n) % 128)))[:n].view(x.shape)


def exact_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                              scale: Optional[float] = None, block_n: int = BLOCK_N, window: int = 0) -> torch.Tensor:
    """Plain torch, float32 inside: the online softmax over key blocks of `block_n` from key 0, every
    block of the buffer visited (no host sync; a block outside a row's keys is an exact no-op).
    Returns [B, H_q, T, d_v] in q's dtype."""
    n_keys = _check(q, k, v, n_keys, window)
    B, HQ, T, D = q.shape
    HKV, L, DV = k.shape[1], k.shape[2], v.shape[3]
    G = HQ // HKV
    scale = D ** -0.5 if scale is None else float(scale)
    qf = q.float().reshape(B, HKV, G, T, 1, D)
    n = n_keys.to(torch.long).clamp(0, L).reshape(B, 1, 1, T, 1)
    lo = (n - window).clamp_min(0) if window > 0 else torch.zeros_like(n)
    m = q.new_full((B, HKV, G, T), float("-inf"), dtype=torch.float32)
    l = torch.zeros_like(m)
    acc = q.new_zeros((B, HKV, G, T, DV), dtype=torch.float32)
    for start in range(0, L, block_n):
        kb, vb = k[:, :, start:start + block_n].float(), v[:, :, start:start + block_n].float()
        if kb.shape[2] < block_n:  # the last block, padded to a whole one
            kb = F.pad(kb, (0, 0, 0, block_n - kb.shape[2]))
            vb = F.pad(vb, (0, 0, 0, block_n - vb.shape[2]))
        j = start + torch.arange(block_n, device=q.device)
        valid = (j < n) & (j >= lo)  # [B, 1, 1, T, BN]
        s = tree_sum(qf * kb[:, :, None, None])[..., 0] * scale  # [B, HKV, G, T, BN]
        s = torch.where(valid, s, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        finite = torch.isfinite(m_new)
        m_safe = torch.where(finite, m_new, 0.0)
        alpha = _padded_exp(torch.where(finite, m - m_safe, 0.0))
        p = _padded_exp(torch.where(valid, s - m_safe[..., None], float("-inf")))
        pv = torch.where(valid[..., None], p[..., None] * vb[:, :, None, None], 0.0)  # stale keys never count
        l = l * alpha + tree_sum(p)[..., 0]
        acc = acc * alpha[..., None] + tree_sum(pv.transpose(-1, -2))[..., 0]
        m = m_new
    out = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], 0.0)
    return out.reshape(B, HQ, T, DV).to(q.dtype)


def _rows_layout(t: torch.Tensor) -> torch.Tensor:
    """t itself when each head is a contiguous [L, d] matrix whose batch/head strides are whole rows
    and whose start is 16-byte aligned (the cache buffers are), else a contiguous copy: the kernel
    then sees the same alignment facts for every buffer."""
    d = t.shape[3]
    ok = (t.stride(3) == 1 and t.stride(2) == d and t.stride(1) % d == 0 and t.stride(0) % d == 0
          and t.data_ptr() % 16 == 0)
    return t if ok else t.contiguous()


def exact_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                           scale: Optional[float] = None, block_n: int = BLOCK_N,
                           num_warps: int = NUM_WARPS, window: int = 0) -> torch.Tensor:
    """The fixed-order kernel (no autograd). `block_n` / `num_warps` are for tests and benchmarks: a
    row's bits are invariant for one fixed choice, and the model always uses the defaults."""
    require_triton()
    n_keys = _check(q, k, v, n_keys, window)
    B, HQ, T, D = q.shape
    HKV, L, DV = k.shape[1], k.shape[2], v.shape[3]
    scale = D ** -0.5 if scale is None else float(scale)
    qc = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # fresh: contiguous and aligned, always
    qc.copy_(q)
    k, v = _rows_layout(k), _rows_layout(v)
    o = torch.empty(B, HQ, T, DV, device=q.device, dtype=q.dtype)
    if o.numel() == 0:
        return o
    BLOCK_D, BLOCK_DV = max(16, next_pow2(D)), max(16, next_pow2(DV))
    _exact_attention_kernel[(B * HQ, T)](
        qc, k, v, n_keys, o,
        k.stride(0) // D, k.stride(1) // D, v.stride(0) // DV, v.stride(1) // DV, n_keys.stride(0), n_keys.stride(1),
        HQ, HQ // HKV, T, L, int(window), scale,
        D=D, DV=DV, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, BLOCK_N=block_n, num_warps=num_warps,
        enable_fp_fusion=True,  # pinned: TRITON_DEFAULT_FP_FUSION (or Triton 3.10's default) must not change the bits
    )
    return o


@torch.library.custom_op("ready_kernels::exact_attention", mutates_args=())
def _exact_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                        scale: float, window: int = 0) -> torch.Tensor:
    if use_triton(q, k, v, n_keys):
        return exact_attention_triton(q, k, v, n_keys, scale, window=window)
    return exact_attention_reference(q, k, v, n_keys, scale, window=window).contiguous()  # the fake's layout


@_exact_attention_op.register_fake
def _(q, k, v, n_keys, scale, window=0):
    return q.new_empty(*q.shape[:3], v.shape[-1])


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                    scale: Optional[float] = None, window: int = 0) -> torch.Tensor:
    """Dispatch (inference): Triton on CUDA, the reference elsewhere; opaque to torch.compile.

    q [B, H_q, T, d]; k, v the cache buffers [B, H_kv, L, d | d_v]; n_keys [T] or [B, T] integer (on
    q's device): row t of batch row b attends over keys 0..n_keys[b, t]-1, or with window > 0 over
    the last `window` of them. Returns [B, H_q, T, d_v]."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.exact_attention(q, k, v, n_keys, scale, int(window))
    return _exact_attention_op(q, k, v, n_keys, scale, int(window))
