"""ReaDy state reader: position-conditioned low-rank reads of the committed GDN states.

For every (source layer, value head) pair m and every draft position p of batch row b:

    S_m   = ssm[layer_idx[m // H], slots[b], m % H]      (d_k x d_v, Hugging Face layout)
    rms_m = sqrt(mean(S_m ** 2) + eps)
    q     = U_m^T z[b, p, m]                             (d_k)
    T     = V_m^T (S_m / rms_m)^T                        (r x d_k)
    u     = T q / sqrt(d_k)                              (r)

and the features are [u for m in 0..M-1 (m-major, r each), log(rms_m) for m in 0..M-1], i.e.
`[B, P, M*r + M]`. The states are read straight out of the cache tensor by (layer, slot) index:
no gather copy. The Triton forward computes, per (b, m), W = U_m S_m on tensor cores (tf32 with
split operands, as accurate as fp32 FMAs), G = W V_m / (rms_m sqrt(d_k)) and u = G^T z for every
position, so the state is touched exactly once per batch row. One program per state: spreading a
state over several programs read it faster but cost more in the cross-program finish, and plain
FMA products were slower (docs/kernels.md; its figures: docs/figures.md).

Training: `state_reader` is differentiable w.r.t. z, U and V (the states are frozen inputs);
the backward is written in torch (einsums), checked against autograd through the reference.
Teacher states `[B, A, Ls, H, d_k, d_v]` become a cache view with `states_as_cache`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._common import HAS_TRITON, last_dim_contiguous, next_pow2, require, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _pair_state_base(ssm_ptr, layer_ptr, slot_ptr, b, m, H, s_l, s_s, s_h):
        layer = tl.load(layer_ptr + m // H).to(tl.int64)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        return ssm_ptr + layer * s_l + slot * s_s + (m % H).to(tl.int64) * s_h

    @triton.jit
    def _load_z_and_v(z_ptr, v_ptr, b, m, z_b, z_p, z_m, P, R, DV, BP: tl.constexpr, BR: tl.constexpr,
                      BV: tl.constexpr):
        """z[b, :, m] as [BP, BR] and V_m as [BV, BR], float32, zero-padded."""
        offs_r = tl.arange(0, BR)
        offs_v = tl.arange(0, BV)
        offs_p = tl.arange(0, BP)
        mask_r = offs_r < R
        zt = tl.load(z_ptr + b.to(tl.int64) * z_b + m * z_m + offs_p[:, None] * z_p + offs_r[None, :],
                     mask=(offs_p < P)[:, None] & mask_r[None, :], other=0.0).to(tl.float32)
        vt = tl.load(v_ptr + m.to(tl.int64) * DV * R + offs_v[:, None] * R + offs_r[None, :],
                     mask=(offs_v < DV)[:, None] & mask_r[None, :], other=0.0).to(tl.float32)
        return zt, vt

    @triton.jit
    def _tf32_high(x):
        """x with its low 13 mantissa bits cleared: exact in tf32, and x - high is exact in fp32."""
        return (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)

    @triton.jit
    def _split_dot(w, s, TERMS: tl.constexpr):
        """w @ s for a weight w and a state s: on FMAs (TERMS = 0), or on tensor cores in tf32 with
        split operands (TERMS = 2: w as high + low part, exact for 16-bit states; 3: both split,
        the error of fp32 FMAs; 1: plain tf32, ~1e-3)."""
        if TERMS == 0:
            out = tl.dot(w, s, input_precision="ieee")
        elif TERMS == 1:
            out = tl.dot(w, s, input_precision="tf32")
        elif TERMS == 2:
            w_hi = _tf32_high(w)
            out = tl.dot(w_hi, s, input_precision="tf32") + tl.dot(w - w_hi, s, input_precision="tf32")
        else:
            w_hi = _tf32_high(w)
            s_hi = _tf32_high(s)
            out = tl.dot(w_hi, s_hi, input_precision="tf32")
            out += tl.dot(w_hi, s - s_hi, input_precision="tf32")
            out += tl.dot(w - w_hi, s_hi, input_precision="tf32")
        return out

    @triton.jit
    def _state_reader_fwd_kernel(
        ssm_ptr, layer_ptr, slot_ptr, z_ptr, u_ptr, v_ptr, out_ptr,
        s_l, s_s, s_h, s_k, s_v,          # ssm strides (elements)
        z_b, z_p, z_m,                    # z strides; its last (rank) dim is contiguous
        o_b, o_p,                         # out strides; its last dim is contiguous
        H, M, P, R, DK, DV,
        eps, inv_sqrt_dk,
        BP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NCHUNK: tl.constexpr,
        TERMS: tl.constexpr,
    ):
        """One program per (b, m). The small operands (z, V, and U for the first block) are loaded
        before the state so their latency hides behind the index lookup; at d_k <= 128 the whole
        state is one block, so all of its loads are in flight together."""
        pid = tl.program_id(0)
        b = pid // M
        m = pid % M
        offs_r = tl.arange(0, BR)
        offs_v = tl.arange(0, BV)
        offs_p = tl.arange(0, BP)
        mask_r = offs_r < R
        mask_v = offs_v < DV
        mask_p = offs_p < P
        zt, vt = _load_z_and_v(z_ptr, v_ptr, b, m, z_b, z_p, z_m, P, R, DV, BP, BR, BV)
        u_base = u_ptr + m.to(tl.int64) * R * DK
        s_base = _pair_state_base(ssm_ptr, layer_ptr, slot_ptr, b, m, H, s_l, s_s, s_h)
        sq = tl.zeros([BK, BV], dtype=tl.float32)
        w = tl.zeros([BR, BV], dtype=tl.float32)
        for c in tl.static_range(NCHUNK):
            kk = c * BK + tl.arange(0, BK)
            mask_k = kk < DK
            uc = tl.load(u_base + offs_r[:, None] * DK + kk[None, :],
                         mask=mask_r[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            s = tl.load(s_base + kk[:, None] * s_k + offs_v[None, :] * s_v,
                        mask=mask_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
            w += _split_dot(uc, s, TERMS)                            # W = U S   [r, d_v]
            sq += s * s
        u = tl.dot(zt, tl.dot(w, vt, input_precision="ieee"), input_precision="ieee")  # z^T (W V)
        # u = z^T U S V / (rms sqrt(d_k)) for every position, and log(rms)
        rms = tl.sqrt(tl.sum(sq) / (DK * DV) + eps)
        u = u * (inv_sqrt_dk / rms)
        o_base = out_ptr + b.to(tl.int64) * o_b
        tl.store(o_base + offs_p[:, None] * o_p + m * R + offs_r[None, :], u,
                 mask=mask_p[:, None] & mask_r[None, :])
        log_rms = tl.zeros([BP], dtype=tl.float32) + tl.log(rms)
        tl.store(o_base + offs_p * o_p + M * R + m, log_rms, mask=mask_p)


def _check_inputs(ssm, layer_idx, slots, z, U, V, out) -> tuple[int, int, int, int, int, int]:
    """Validate shapes/dtypes; returns (B, P, M, r, d_k, d_v)."""
    require(ssm.dim() == 5, f"state_reader: ssm must be [L_gdn, S, H, d_k, d_v], got shape {tuple(ssm.shape)}")
    require(ssm.dtype in (torch.float32, torch.bfloat16, torch.float16),
            f"state_reader: ssm dtype must be float32, bfloat16 or float16, got {ssm.dtype}")
    _, _, H, dk, dv = ssm.shape
    require(layer_idx.dim() == 1 and not layer_idx.is_floating_point(),
            f"state_reader: layer_idx must be a 1-d integer tensor of GDN indices, got {layer_idx.dtype} {tuple(layer_idx.shape)}")
    require(slots.dim() == 1 and not slots.is_floating_point(),
            f"state_reader: slots must be a 1-d integer tensor of cache rows, got {slots.dtype} {tuple(slots.shape)}")
    M = layer_idx.numel() * H
    B = slots.numel()
    require(z.dim() == 4 and z.shape[0] == B and z.shape[2] == M,
            f"state_reader: z must be [B={B}, P, M={M}, r] (M = len(layer_idx) * H), got {tuple(z.shape)}")
    P, r = z.shape[1], z.shape[3]
    require(tuple(U.shape) == (M, r, dk), f"state_reader: U must be [M={M}, r={r}, d_k={dk}], got {tuple(U.shape)}")
    require(tuple(V.shape) == (M, dv, r), f"state_reader: V must be [M={M}, d_v={dv}, r={r}], got {tuple(V.shape)}")
    devs = {t.device for t in (ssm, layer_idx, slots, z, U, V)}
    require(len(devs) == 1, f"state_reader: all inputs must be on one device, got {sorted(map(str, devs))}")
    if out is not None:
        require(tuple(out.shape) == (B, P, M * r + M),
                f"state_reader: out must be [B={B}, P={P}, M*r+M={M * r + M}], got {tuple(out.shape)}")
        require(out.device == z.device, f"state_reader: out must be on {z.device}, got {out.device}")
        require(out.stride(-1) == 1, "state_reader: out's last dimension must be contiguous")
    return B, P, M, r, dk, dv


def _whole(idx: torch.Tensor, n: int) -> bool:
    """`idx` is 0..n-1 in order (read on the host, so CPU only: a CUDA index is never checked)."""
    return idx.device.type == "cpu" and idx.numel() == n and bool(torch.equal(idx, torch.arange(n)))


def _gather_states(ssm: torch.Tensor, layer_idx: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """[B, M, d_k, d_v] float32 states the reader reads (torch paths only): a view, no copy, when every
    layer and slot is read in order (training's teacher states, `states_as_cache`), else a copy."""
    s = ssm if _whole(layer_idx, ssm.shape[0]) else ssm.index_select(0, layer_idx)
    s = s if _whole(slots, ssm.shape[1]) else s.index_select(1, slots)  # [Ls, B, H, dk, dv]
    Ls, B, H, dk, dv = s.shape
    return s.transpose(0, 1).reshape(B, Ls * H, dk, dv).float()


def state_reader_reference(ssm: torch.Tensor, layer_idx: torch.Tensor, slots: torch.Tensor, z: torch.Tensor,
                           U: torch.Tensor, V: torch.Tensor, eps: float = 1e-6,
                           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain-torch reader (the ground truth; differentiable): the module docstring's formula, contracted
    as u = V^T (S^T q) / (rms sqrt(d_k)), so each state is read twice in place (its norm, one batched
    product with the P queries) and never copied, permuted or divided (the formula's order, T = V^T S̄^T
    first, took ~20x longer on a CPU core at training's shapes)."""
    B, P, M, r, dk, dv = _check_inputs(ssm, layer_idx, slots, z, U, V, out)
    S = _gather_states(ssm, layer_idx, slots)                                    # [B, M, dk, dv]
    rms = torch.sqrt(torch.linalg.vector_norm(S, dim=(-2, -1)).square() / (dk * dv) + eps)  # [B, M]
    q = torch.einsum("bpmi,mik->bmpk", z.float(), U.float())                    # q = U^T z   [B, M, P, dk]
    w = torch.matmul(q, S)                                                       # S^T q       [B, M, P, dv]
    u = torch.einsum("bmpv,mvi->bpmi", w, V.float()) / (rms * math.sqrt(dk))[:, None, :, None]  # [B, P, M, r]
    log_rms = torch.log(rms)[:, None, :].expand(B, P, M)
    feats = torch.cat([u.reshape(B, P, M * r), log_rms], dim=-1)
    if out is None:
        return feats.to(z.dtype)
    out.copy_(feats)
    return out


# How U S is multiplied (see _split_dot). The default per state dtype keeps fp32-FMA accuracy on
# tensor cores: 16-bit states are exact in tf32, so only U is split (tf32x2); fp32 states split
# both operands (tf32x3).
PRECISIONS = {"ieee": 0, "tf32": 1, "tf32x2": 2, "tf32x3": 3}


def _default_precision(state_dtype: torch.dtype) -> str:
    return "tf32x3" if state_dtype == torch.float32 else "tf32x2"


def _launch_forward(ssm, layer_idx, slots, z, U, V, eps, out, dims, block_k=None, num_warps=None,
                    precision=None) -> torch.Tensor:
    B, P, M, r, dk, dv = dims
    z = last_dim_contiguous(z)
    U = U.contiguous()
    V = V.contiguous()
    if out is None:
        out = torch.empty(B, P, M * r + M, device=z.device, dtype=z.dtype)
    precision = precision or _default_precision(ssm.dtype)
    require(precision in PRECISIONS, f"state_reader: precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    BR = max(16, next_pow2(r))
    BV = max(16, next_pow2(dv))
    BP = max(16, next_pow2(P))
    # the whole state in one block up to 128 x 128 (all loads in flight at once); 8 warps for a
    # 64 KB fp32 block, 4 for a 32 KB 16-bit one (H200 sweeps, docs/kernels.md)
    BK = block_k or max(16, min(next_pow2(dk), 16384 // BV))
    warps = num_warps or (8 if BK * BV * ssm.element_size() >= 65536 else 4)
    _state_reader_fwd_kernel[(B * M,)](
        ssm, layer_idx, slots, z, U, V, out,
        *ssm.stride(), z.stride(0), z.stride(1), z.stride(2), out.stride(0), out.stride(1),
        ssm.shape[2], M, P, r, dk, dv, float(eps), 1.0 / math.sqrt(dk),
        BP=BP, BR=BR, BK=BK, BV=BV, NCHUNK=-(-dk // BK), TERMS=PRECISIONS[precision], num_warps=warps,
    )
    return out


def _reader_backward(ssm, layer_idx, slots, z, U, V, eps, grad_out, need_z, need_U, need_V):
    """Gradients of the features w.r.t. z, U, V (torch einsums over the gathered states).

    With Ŝ = S / (rms sqrt(d_k)) and G = U Ŝ V (r x r per (b, m)), u = G^T z, so
    dz = G du, dG = sum_p z du^T, dU = dG (Ŝ V)^T, dV = (U Ŝ)^T dG. log(rms) carries no
    gradient to z, U, V (the states are frozen).
    """
    B, P, M, r = z.shape
    dk = U.shape[-1]
    S = _gather_states(ssm, layer_idx, slots)
    rms = torch.sqrt(S.pow(2).mean(dim=(-2, -1)) + eps)
    S_hat = S / (rms * math.sqrt(dk))[..., None, None]                 # [B, M, dk, dv]
    Uf, Vf = U.float(), V.float()
    du = grad_out[..., : M * r].float().reshape(B, P, M, r)
    dz = dU = dV = None
    if need_z:
        G = torch.einsum("mik,bmkv,mvj->bmij", Uf, S_hat, Vf)
        dz = torch.einsum("bmij,bpmj->bpmi", G, du).to(z.dtype)
    if need_U or need_V:
        dG = torch.einsum("bpmi,bpmj->bmij", z.float(), du)            # [B, M, r, r]
        if need_U:
            SV = torch.einsum("bmkv,mvj->bmkj", S_hat, Vf)
            dU = torch.einsum("bmij,bmkj->mik", dG, SV).to(U.dtype)
        if need_V:
            US = torch.einsum("mik,bmkv->bmiv", Uf, S_hat)
            dV = torch.einsum("bmiv,bmij->mvj", US, dG).to(V.dtype)
    return dz, dU, dV


class _StateReaderFn(torch.autograd.Function):
    """Triton forward, torch backward; gradients flow to z, U, V (never to the states)."""

    @staticmethod
    def forward(ctx, ssm, layer_idx, slots, z, U, V, eps, out, dims):  # type: ignore[override]
        feats = _launch_forward(ssm, layer_idx, slots, z, U, V, eps, out, dims)
        ctx.save_for_backward(ssm, layer_idx, slots, z, U, V)
        ctx.eps = eps
        if out is not None:
            ctx.mark_dirty(out)
        return feats

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        ssm, layer_idx, slots, z, U, V = ctx.saved_tensors
        need = ctx.needs_input_grad
        dz, dU, dV = _reader_backward(ssm, layer_idx, slots, z, U, V, ctx.eps, grad_out, need[3], need[4], need[5])
        return None, None, None, dz, dU, dV, None, None, None


def state_reader_triton(ssm: torch.Tensor, layer_idx: torch.Tensor, slots: torch.Tensor, z: torch.Tensor,
                        U: torch.Tensor, V: torch.Tensor, eps: float = 1e-6, out: Optional[torch.Tensor] = None,
                        *, block_k: Optional[int] = None, num_warps: Optional[int] = None,
                        precision: Optional[str] = None) -> torch.Tensor:
    """Fused reader: one Triton program per (batch row, layer-head pair), states read in place.

    Differentiable w.r.t. z, U, V when grad mode is on (torch backward). `block_k`, `num_warps`
    and `precision` (how U S is multiplied: a key of PRECISIONS) override the defaults
    (benchmarks and tests).
    """
    require_triton()
    dims = _check_inputs(ssm, layer_idx, slots, z, U, V, out)
    if torch.is_grad_enabled() and (z.requires_grad or U.requires_grad or V.requires_grad):
        return _StateReaderFn.apply(ssm.detach(), layer_idx, slots, z, U, V, float(eps), out, dims)
    return _launch_forward(ssm, layer_idx, slots, z, U, V, eps, out, dims, block_k, num_warps, precision)


def state_reader(ssm: torch.Tensor, layer_idx: torch.Tensor, slots: torch.Tensor, z: torch.Tensor,
                 U: torch.Tensor, V: torch.Tensor, eps: float = 1e-6,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reader features `[B, P, M*r + M]`: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(ssm, z, U, V):
        return state_reader_triton(ssm, layer_idx, slots, z, U, V, eps, out)
    return state_reader_reference(ssm, layer_idx, slots, z, U, V, eps, out)


def states_as_cache(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher states `[B, A, Ls, H, d_k, d_v]` as (ssm view `[Ls, B*A, H, d_k, d_v]`, layer_idx, slots).

    No copy: the reader takes arbitrary strides. z must then be `[B*A, P, Ls*H, r]`.
    """
    require(states.dim() == 6, f"states_as_cache: states must be [B, A, Ls, H, d_k, d_v], got {tuple(states.shape)}")
    B, A, Ls = states.shape[:3]
    view = states.flatten(0, 1).transpose(0, 1)
    layer_idx = torch.arange(Ls, device=states.device)
    slots = torch.arange(B * A, device=states.device)
    return view, layer_idx, slots
