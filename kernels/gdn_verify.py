"""GDN verify: the gated-delta-rule recurrence over the K+1 verified tokens, keeping every state.

Per value head, with `g` the log decay, `beta` in (0, 1), q/k L2-normalised (Hugging Face layout,
S is d_k x d_v and the readout sums over d_k):

    S = S * exp(g_t);  S = S + k_t ⊗ (beta_t * (v_t - S^T k_t));  o_t = S^T (scale * q_t)

`gdn_verify` reads the live state (never writes it) and returns the outputs; it can also write the
state after every token (`states [B, T, H, d_k, d_v]` float32; tests and benchmarks). The engine
does not keep those states: writing 8 fp32 states a layer cost a verify more than the replay costs
the commit (docs/kernels.md). Its verify keeps each token's inputs instead (`input_width`: [k | v | g | beta]
float32 per value head, `cache.pending_inputs`), and `gdn_commit` replays the accepted tokens from
the live state in one launch over every layer, with the same token step on the same tile, so the
replayed state has the bits the verify's chain had. `conv_windows` gives the causal-conv windows
after every token (torch: it is pure indexing). Inference only: none of these ops is differentiable.

The Triton kernel runs one program per (batch row, head, d_v block): the d_v columns of S are
independent in this recurrence, so each program keeps its S[:, block] in registers for all T tokens.
The next token's inputs are loaded while the current one is computed, and both reductions of a token
read the previous state, side by side. (A chunk form, a compile-time-unrolled token loop and other
column splits were measured slower on the H200 while every state was written; docs/kernels.md.)
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ._common import HAS_TRITON, last_dim_contiguous, next_pow2, require, require_triton, use_triton

# The launch of every kernel that steps a GDN state (verify, fused verify, the commit's replay): 16-column
# slices of S with 2 warps (fastest in the H200 sweep at H = 48, d = 128, T = 8: docs/kernels.md). One
# tile and one warp count give one reduction order, so the replay rounds as the verify's chain did.
BLOCK_V, NUM_WARPS = 16, 2


if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _load_token(t, q_base, k_base, v_base, g_base, be_base, q_t, k_t, v_t, g_t, be_t,
                    offs_k, offs_v, mask_k, mask_v):
        """Token t's q, k, v, g and beta."""
        q = tl.load(q_base + t * q_t + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_base + t * k_t + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_base + t * v_t + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        g = tl.load(g_base + t * g_t).to(tl.float32)
        beta = tl.load(be_base + t * be_t).to(tl.float32)
        return q, k, v, g, beta

    @triton.jit
    def _delta_step(s, k, v, g, beta):
        """Token step of the state alone on the [d_k, BV] slice: (S_t, decay, delta). The one
        definition of the update, shared by verify and the commit's replay, so both round alike."""
        decay = tl.exp(g)
        sk = tl.sum(s * k[:, None], 0)
        delta = (v - decay * sk) * beta
        return s * decay + k[:, None] * delta[None, :], decay, delta

    @triton.jit
    def _token_step(s, t, q, k, v, g, beta, scale, o_base, st_base, o_t, st_t, offs_v, mask_v, mask_s,
                    STORE: tl.constexpr = True):
        """One token on the [d_k, BV] slice: writes o_t (and S_t when STORE), returns S_t."""
        q = q * scale
        sq = tl.sum(s * q[:, None], 0)
        s, decay, delta = _delta_step(s, k, v, g, beta)
        o = decay * sq + tl.sum(k * q) * delta
        tl.store(o_base + t * o_t + offs_v, o, mask=mask_v)
        if STORE:
            # streaming store (evict first): only the accepted token's state is read again, by the commit
            tl.store(st_base + t * st_t, s, mask=mask_s, cache_modifier=".cs")
        return s

    @triton.jit
    def _store_inputs(in_base, t, in_t, k, v, g, beta, offs_k, offs_v, mask_k, mask_v, first, DK, DV):
        """Token t's replay inputs of one value head: [k (d_k) | v (d_v) | g | beta] float32; k, g and
        beta by the head's first d_v block only (`first`: a [BK] bool vector, all true or all false), v by
        every block."""
        row = in_base + t * in_t
        tl.store(row + offs_k, k, mask=mask_k & first)
        tl.store(row + DK + offs_v, v, mask=mask_v)
        one = offs_k < 1
        tl.store(row + DK + DV + offs_k * 0, g + offs_k * 0.0, mask=one & first)
        tl.store(row + DK + DV + 1 + offs_k * 0, beta + offs_k * 0.0, mask=one & first)

    @triton.jit
    def _gdn_verify_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, h0_ptr, o_ptr, st_ptr,
        q_b, q_t, q_h, k_b, k_t, k_h, v_b, v_t, v_h,
        g_b, g_t, g_h, be_b, be_t, be_h,
        h0_b, h0_h, h0_k, h0_v,
        o_b, o_t, o_h,
        st_b, st_t, st_h, st_k,
        H, DK, DV,
        SCALE: tl.constexpr, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, STORE: tl.constexpr = True,
    ):
        """One program per (batch row, head, d_v block); S[:, block] stays in registers for all T
        tokens. Token t+1's inputs are loaded while token t is computed, so the per-token chain
        never waits on memory. Both reductions of a token run on the previous state, side by side:
        with S' = d S + k delta^T,  delta = beta (v - d S^T k)  and  o = S'^T q = d S^T q + (k.q) delta."""
        i_bh = tl.program_id(0)
        i_v = tl.program_id(1)
        b = (i_bh // H).to(tl.int64)
        h = (i_bh % H).to(tl.int64)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        mask_s = mask_k[:, None] & mask_v[None, :]
        q_base = q_ptr + b * q_b + h * q_h
        k_base = k_ptr + b * k_b + h * k_h
        v_base = v_ptr + b * v_b + h * v_h
        g_base = g_ptr + b * g_b + h * g_h
        be_base = beta_ptr + b * be_b + h * be_h
        o_base = o_ptr + b * o_b + h * o_h
        st_base = st_ptr + b * st_b + h * st_h + offs_k[:, None] * st_k + offs_v[None, :]

        s = tl.load(h0_ptr + b * h0_b + h * h0_h + offs_k[:, None] * h0_k + offs_v[None, :] * h0_v,
                    mask=mask_s, other=0.0).to(tl.float32)
        q_n, k_n, v_n, g_n, be_n = _load_token(0, q_base, k_base, v_base, g_base, be_base,
                                               q_t, k_t, v_t, g_t, be_t, offs_k, offs_v, mask_k, mask_v)
        for t in range(T):
            q, k, v, g, beta = q_n, k_n, v_n, g_n, be_n
            # the prefetch after the last token wraps to token 0: in bounds, never used
            q_n, k_n, v_n, g_n, be_n = _load_token((t + 1) % T, q_base, k_base, v_base, g_base, be_base,
                                                   q_t, k_t, v_t, g_t, be_t, offs_k, offs_v, mask_k, mask_v)
            s = _token_step(s, t, q, k, v, g, beta, SCALE, o_base, st_base, o_t, st_t, offs_v, mask_v, mask_s,
                            STORE)

    @triton.jit(do_not_specialize=["n_all"])
    def _gdn_replay_kernel(s_ptr, in_ptr, n_ptr, n_all, s_l, s_b, s_h, s_k, in_l, in_b, in_t, in_h,
                           B, H, T, DK, DV, NV, PER_ROW: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
        """Program (d_v block; layer, batch row, value head): S[:, block] <- the state after the first n
        pending tokens, stepped from the live S with `_delta_step` on the verify kernels' tile (BK x BV,
        the same warps), so it has the bits the verify's chain had. n per row from n_ptr, else n_all;
        clamped to 0..T so a bad n never reads out of bounds. The NV d_v blocks of a head are
        neighbours in the (1-D) grid: they run side by side and read its contiguous state together."""
        pid = tl.program_id(0)
        i_v = pid % NV
        i = pid // NV
        l = (i // (B * H)).to(tl.int64)
        b = ((i // H) % B).to(tl.int64)
        h = (i % H).to(tl.int64)
        if PER_ROW:
            n = tl.load(n_ptr + b).to(tl.int32)
        else:
            n = n_all
        n = tl.minimum(tl.maximum(n, 0), T)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        mask_s = mask_k[:, None] & mask_v[None, :]
        s_ptrs = s_ptr + l * s_l + b * s_b + h * s_h + offs_k[:, None] * s_k + offs_v[None, :]
        s = tl.load(s_ptrs, mask=mask_s, other=0.0)
        row = in_ptr + l * in_l + b * in_b + h * in_h
        for t in range(n):
            k = tl.load(row + t * in_t + offs_k, mask=mask_k, other=0.0)
            v = tl.load(row + t * in_t + DK + offs_v, mask=mask_v, other=0.0)
            g = tl.load(row + t * in_t + DK + DV)
            beta = tl.load(row + t * in_t + DK + DV + 1)
            s, _, _ = _delta_step(s, k, v, g, beta)
        tl.store(s_ptrs, s, mask=mask_s)

    # n_all must stay a runtime value: Triton specialises an int argument equal to 1 into a
    # constant, which has no `.to` (the AR step commits n = 1)
    @triton.jit(do_not_specialize=["n_all"])
    def _window_copy_kernel(dst_ptr, src_ptr, n_ptr, n_all, d_l, d_b, s_l, s_b, s_t, B, T, E,
                           PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
        i_lb = tl.program_id(0)
        i_e = tl.program_id(1)
        l = (i_lb // B).to(tl.int64)
        b = (i_lb % B).to(tl.int64)
        # state after token n (1-based; per row from n_ptr, else n_all); clamped so a bad n can
        # never read out of bounds
        if PER_ROW:
            n = tl.load(n_ptr + b).to(tl.int64)
        else:
            n = n_all.to(tl.int64)
        t = tl.minimum(tl.maximum(n - 1, 0), T - 1)
        offs = i_e * BLOCK + tl.arange(0, BLOCK)
        mask = offs < E
        x = tl.load(src_ptr + l * s_l + b * s_b + t * s_t + offs, mask=mask)
        tl.store(dst_ptr + l * d_l + b * d_b + offs, x, mask=mask)


# --------------------------------------------------------------------------------------------
# verify


def _check_verify(q, k, v, g, beta, initial_state, out_states) -> tuple[int, int, int, int, int]:
    require(q.dim() == 4, f"gdn_verify: q must be [B, T, H, d_k], got {tuple(q.shape)}")
    B, T, H, dk = q.shape
    require(tuple(k.shape) == (B, T, H, dk), f"gdn_verify: k must be [B, T, H, d_k] = {(B, T, H, dk)}, got {tuple(k.shape)}")
    require(v.dim() == 4 and tuple(v.shape[:3]) == (B, T, H),
            f"gdn_verify: v must be [B={B}, T={T}, H={H}, d_v], got {tuple(v.shape)}")
    dv = v.shape[3]
    require(tuple(g.shape) == (B, T, H), f"gdn_verify: g must be [B, T, H] = {(B, T, H)}, got {tuple(g.shape)}")
    require(tuple(beta.shape) == (B, T, H), f"gdn_verify: beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    require(tuple(initial_state.shape) == (B, H, dk, dv),
            f"gdn_verify: initial_state must be [B, H, d_k, d_v] = {(B, H, dk, dv)}, got {tuple(initial_state.shape)}")
    if out_states is not None:
        require(tuple(out_states.shape) == (B, T, H, dk, dv),
                f"gdn_verify: out_states must be [B, T, H, d_k, d_v] = {(B, T, H, dk, dv)}, got {tuple(out_states.shape)}")
        require(out_states.dtype == torch.float32, f"gdn_verify: out_states must be float32, got {out_states.dtype}")
    devs = {t.device for t in (q, k, v, g, beta, initial_state)}
    require(len(devs) == 1, f"gdn_verify: all inputs must be on one device, got {sorted(map(str, devs))}")
    return B, T, H, dk, dv


def gdn_verify_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         initial_state: torch.Tensor, scale: Optional[float] = None,
                         out_states: Optional[torch.Tensor] = None, *, keep_states: bool = True,
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Token-by-token recurrence in float32 (the ground truth). Returns (o [B,T,H,d_v], states, or None
    when not `keep_states`)."""
    B, T, H, dk, dv = _check_verify(q, k, v, g, beta, initial_state, out_states)
    scale = dk ** -0.5 if scale is None else scale
    states = out_states if out_states is not None else q.new_empty(B, T, H, dk, dv, dtype=torch.float32)
    o = torch.empty(B, T, H, dv, device=q.device, dtype=torch.float32)
    S = initial_state.float()
    for t in range(T):
        k_t, v_t, q_t = k[:, t].float(), v[:, t].float(), q[:, t].float() * scale
        S = S * torch.exp(g[:, t].float())[..., None, None]
        delta = (v_t - torch.einsum("bhkv,bhk->bhv", S, k_t)) * beta[:, t].float()[..., None]
        S = S + k_t[..., :, None] * delta[..., None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q_t)
        states[:, t] = S
    return o.to(v.dtype), (states if keep_states else None)


def gdn_verify_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      initial_state: torch.Tensor, scale: Optional[float] = None,
                      out_states: Optional[torch.Tensor] = None, *, keep_states: bool = True,
                      block_v: Optional[int] = None, num_warps: Optional[int] = None,
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Fused recurrence; `keep_states=False` writes no state (the engine's commit replays the accepted
    tokens instead); `block_v`/`num_warps` override the launch heuristics (benchmarks and tests)."""
    require_triton()
    B, T, H, dk, dv = _check_verify(q, k, v, g, beta, initial_state, out_states)
    require(keep_states or out_states is None, "gdn_verify: out_states given with keep_states=False")
    scale = dk ** -0.5 if scale is None else scale
    q, k, v = last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v)
    if keep_states:
        states = out_states if out_states is not None else q.new_empty(B, T, H, dk, dv, dtype=torch.float32)
    else:
        states = q.new_empty(1, 1, 1, 1, 1, dtype=torch.float32)  # a placeholder argument, never written
    require(states.stride(-1) == 1, "gdn_verify: out_states' last dimension must be contiguous")
    o = torch.empty(B, T, H, dv, device=q.device, dtype=v.dtype)
    BK = max(16, next_pow2(dk))
    BV = block_v or BLOCK_V
    grid = (B * H, triton.cdiv(dv, BV))
    _gdn_verify_kernel[grid](
        q, k, v, g, beta, initial_state, o, states,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1), g.stride(2), beta.stride(0), beta.stride(1), beta.stride(2),
        *initial_state.stride(),
        o.stride(0), o.stride(1), o.stride(2),
        states.stride(0), states.stride(1), states.stride(2), states.stride(3),
        H, dk, dv,
        # the scale as a constexpr: torch.compile passes a Python float to a Triton kernel as fp64
        SCALE=float(scale), T=T, BK=BK, BV=BV, STORE=keep_states, num_warps=num_warps or NUM_WARPS,
    )
    return o, (states if keep_states else None)


def gdn_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               initial_state: torch.Tensor, scale: Optional[float] = None,
               out_states: Optional[torch.Tensor] = None, *, keep_states: bool = True,
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(o [B,T,H,d_v], states [B,T,H,d_k,d_v] fp32 or None): Triton on CUDA, the torch reference elsewhere."""
    if use_triton(q, k, v, initial_state):
        return gdn_verify_triton(q, k, v, g, beta, initial_state, scale, out_states, keep_states=keep_states)
    return gdn_verify_reference(q, k, v, g, beta, initial_state, scale, out_states, keep_states=keep_states)


# --------------------------------------------------------------------------------------------
# commit: replay the accepted tokens from their inputs


def input_width(dk: int, dv: int) -> int:
    """Floats per (token, value head) in a pending-inputs buffer: [k (d_k) | v (d_v) | g | beta]."""
    return dk + dv + 2


def _check_window(dst: torch.Tensor, src: torch.Tensor, n: Union[int, torch.Tensor]) -> None:
    require(src.dim() == dst.dim() + 1 and src.shape[:2] == dst.shape[:2] and src.shape[3:] == dst.shape[2:],
            f"gdn_commit: pending_conv must be [L, B, T, ...] matching conv [L, B, ...] = "
            f"{tuple(dst.shape)}, got {tuple(src.shape)}")
    require(src.dtype == dst.dtype, f"gdn_commit: pending_conv dtype {src.dtype} differs from conv's {dst.dtype}")


def _check_commit(ssm: torch.Tensor, inputs: torch.Tensor, n: Union[int, torch.Tensor]) -> None:
    require(ssm.dim() == 5 and ssm.dtype == torch.float32,
            f"gdn_commit: ssm must be float32 [L, B, H, d_k, d_v], got {ssm.dtype} {tuple(ssm.shape)}")
    L, B, H, dk, dv = ssm.shape
    require(inputs.dim() == 5 and tuple(inputs.shape[:2]) == (L, B) and inputs.shape[3] == H
            and inputs.shape[4] == input_width(dk, dv) and inputs.dtype == torch.float32,
            f"gdn_commit: pending_inputs must be float32 [L={L}, B={B}, T, H={H}, d_k + d_v + 2={input_width(dk, dv)}], "
            f"got {inputs.dtype} {tuple(inputs.shape)}")
    T = inputs.shape[2]
    if isinstance(n, torch.Tensor):
        require(n.dim() == 1 and n.numel() == B and not n.is_floating_point(),
                f"gdn_commit: n must be an int or an integer tensor [B={B}], got {n.dtype} {tuple(n.shape)}")
    else:
        require(1 <= int(n) <= T, f"gdn_commit: n must be in 1..{T} (tokens kept), got {n}")


def _copy_window_reference(dst: torch.Tensor, src: torch.Tensor, n: Union[int, torch.Tensor]) -> None:
    if isinstance(n, torch.Tensor):
        rows = torch.arange(dst.shape[1], device=dst.device)
        dst.copy_(src[:, rows, n.to(dst.device).long() - 1])
    else:
        dst.copy_(src[:, :, int(n) - 1])


def _copy_window_triton(dst: torch.Tensor, src: torch.Tensor, n: Union[int, torch.Tensor], block: int = 4096) -> None:
    L, B, T = src.shape[:3]
    E = dst[0, 0].numel()
    if not (dst[0, 0].is_contiguous() and src[0, 0, 0].is_contiguous()):
        _copy_window_reference(dst, src, n)  # unusual layouts: torch's strided copy
        return
    per_row = isinstance(n, torch.Tensor)
    grid = (L * B, triton.cdiv(E, block))
    _window_copy_kernel[grid](dst, src, n if per_row else dst, 0 if per_row else int(n),
                             dst.stride(0), dst.stride(1), src.stride(0), src.stride(1), src.stride(2),
                             B, T, E, PER_ROW=per_row, BLOCK=block)


def _window(copy_one, conv: Optional[torch.Tensor], pending_conv: Optional[torch.Tensor], n) -> None:
    if conv is not None:
        require(pending_conv is not None, "gdn_commit: conv given without pending_conv")
        _check_window(conv, pending_conv, n)
        copy_one(conv, pending_conv, n)


def gdn_commit_reference(ssm: torch.Tensor, pending_inputs: torch.Tensor, n: Union[int, torch.Tensor],
                         conv: Optional[torch.Tensor] = None, pending_conv: Optional[torch.Tensor] = None) -> None:
    """Advance the live states ssm [L, B, H, d_k, d_v] in place over the first n pending tokens (1-based
    count; int or integer tensor [B]) from their inputs pending_inputs [L, B, T, H, d_k + d_v + 2], with
    the kernels' token step (S = S d + k (x) beta (v - d S^T k), d = exp(g)); conv [L, B, C, W] <-
    pending_conv[:, :, n - 1] when given. Plain torch (the ground truth)."""
    _check_commit(ssm, pending_inputs, n)
    dk, dv = ssm.shape[3], ssm.shape[4]
    counts = n.tolist() if isinstance(n, torch.Tensor) else [int(n)] * ssm.shape[1]
    for b, nb in enumerate(counts):
        S = ssm[:, b]
        for t in range(max(0, min(int(nb), pending_inputs.shape[2]))):
            row = pending_inputs[:, b, t]  # [L, H, width]
            k, v = row[..., :dk], row[..., dk:dk + dv]
            decay, beta = row[..., dk + dv].exp()[..., None], row[..., dk + dv + 1, None]
            delta = (v - decay * (S * k[..., :, None]).sum(-2)) * beta
            S = S * decay[..., None] + k[..., :, None] * delta[..., None, :]
        ssm[:, b] = S
    _window(_copy_window_reference, conv, pending_conv, n)


def gdn_commit_triton(ssm: torch.Tensor, pending_inputs: torch.Tensor, n: Union[int, torch.Tensor],
                      conv: Optional[torch.Tensor] = None, pending_conv: Optional[torch.Tensor] = None) -> None:
    """As `gdn_commit_reference`, in one launch over every layer; a per-row n is read on the device
    (no host sync, graph-safe). Its replay has the bits of the verify kernels' chain (same tile, same
    token step)."""
    require_triton()
    _check_commit(ssm, pending_inputs, n)
    L, B, H, dk, dv = ssm.shape
    require(ssm.stride(-1) == 1 and pending_inputs.stride(-1) == 1,
            "gdn_commit: ssm's and pending_inputs' last dimensions must be contiguous")
    per_row = isinstance(n, torch.Tensor)
    BV = BLOCK_V
    NV = triton.cdiv(dv, BV)
    _gdn_replay_kernel[(NV * L * B * H,)](
        ssm, pending_inputs, n if per_row else ssm, 0 if per_row else int(n),
        ssm.stride(0), ssm.stride(1), ssm.stride(2), ssm.stride(3),
        pending_inputs.stride(0), pending_inputs.stride(1), pending_inputs.stride(2), pending_inputs.stride(3),
        B, H, pending_inputs.shape[2], dk, dv, NV, PER_ROW=per_row, BK=max(16, next_pow2(dk)), BV=BV,
        num_warps=NUM_WARPS)
    _window(_copy_window_triton, conv, pending_conv, n)


def gdn_commit(ssm: torch.Tensor, pending_inputs: torch.Tensor, n: Union[int, torch.Tensor],
               conv: Optional[torch.Tensor] = None, pending_conv: Optional[torch.Tensor] = None) -> None:
    """Commit dispatch: Triton on CUDA, the torch reference elsewhere."""
    if use_triton(ssm, pending_inputs):
        gdn_commit_triton(ssm, pending_inputs, n, conv, pending_conv)
    else:
        gdn_commit_reference(ssm, pending_inputs, n, conv, pending_conv)


# --------------------------------------------------------------------------------------------
# conv windows


def conv_windows(conv_state: torch.Tensor, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Causal-conv window after every token: `[B, T, C, W]` from the live window `[B, C, W]` and inputs `[B, T, C]`.

    Window after token t = the last W columns of [conv_state | x[:, :t+1]^T]. Pure indexing, so a
    torch op (one cat + one strided copy); write it into `cache.pending_conv[l]` with `out=`.
    """
    require(conv_state.dim() == 3, f"conv_windows: conv_state must be [B, C, W], got {tuple(conv_state.shape)}")
    B, C, W = conv_state.shape
    require(x.dim() == 3 and x.shape[0] == B and x.shape[2] == C,
            f"conv_windows: x must be [B={B}, T, C={C}], got {tuple(x.shape)}")
    full = torch.cat([conv_state, x.transpose(1, 2).to(conv_state.dtype)], dim=-1)  # [B, C, W + T]
    win = full.unfold(-1, W, 1)[:, :, 1:].permute(0, 2, 1, 3)                         # [B, T, C, W]
    if out is None:
        return win.contiguous()
    require(tuple(out.shape) == tuple(win.shape), f"conv_windows: out must be {tuple(win.shape)}, got {tuple(out.shape)}")
    out.copy_(win)
    return out
