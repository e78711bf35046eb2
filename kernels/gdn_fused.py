"""GDN verify with its front in the same launch: causal conv, SiLU, L2 norms, gates and recurrence.

On the GPU a verify pass of a Gated DeltaNet layer (the AR step is a verify of one token) ran,
between the input projection and the output norm, five small inductor kernels (conv taps + SiLU,
the q/k L2 norms, the gates), the recurrence (`gdn_verify`) and a copy of the conv windows, most of
their time launch and latency rather than the recurrence's state traffic (docs/kernels.md).
`gdn_fused_verify` takes the projection's raw outputs and does all of it in one kernel.

Inputs, as the layer holds them (H = value heads, nk key heads, C = 2 nk d_k + H d_v, W = conv kernel - 1):

    mixed [B, T, C]   raw q | k | v channels, before the conv (a view of the projection's output)
    b, a  [B, T, H]   raw beta and decay inputs
    conv_state [B, C, W]   the live conv window (last W inputs; read only)
    conv_weight [C, W + 1], A_log [H], dt_bias [H]
    initial_state [B, H, d_k, d_v] float32   the live recurrent state (read only)

It writes `windows [B, T, C, W]` (the conv window after every token, `cache.pending_conv`), and
either `states [B, T, H, d_k, d_v]` float32 (the state after every token; tests, benchmarks) or, with
`out_inputs`, each token's replay inputs `[B, T, H, d_k + d_v + 2]` (`cache.pending_inputs`, from
which `gdn_verify.gdn_commit` replays the accepted tokens). It returns `o [B, T, H, d_v]` float32. Per token it follows the layer's eager arithmetic
(`GatedDeltaNet._conv(taps=True)`, `_heads`): y = silu(round(sum_j w_j x_{t-W+j})) rounded to the
input dtype; q = l2norm(y_q) d_k^-0.5 and k = l2norm(y_k) of key head h // (H / nk); v = y_v;
beta = sigmoid(b); g = -exp(A_log) softplus(a + dt_bias); then `gdn_verify`'s token step. A token's
arithmetic does not depend on T, so verify(K+1) and K+1 AR steps compute the same values.

A chunk form (fronts in [16, C] tiles, a triangular solve instead of T serial steps) was written and
measured far slower than the token loop at T=8 on the H200, so verify blocks keep the loop
(docs/kernels.md; code in git history at 211e58f).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton
from .gdn_verify import BLOCK_V, NUM_WARPS, gdn_verify_reference, gdn_verify_triton, input_width

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .gdn_verify import _store_inputs, _token_step

    @triton.jit
    def _conv_tap(x_ptr, cs_ptr, s, chan, mask, x_t, cs_c, W: tl.constexpr):
        """Raw input at token s (< 0: from the live window) of the channels `chan`."""
        fresh = (chan * 0 + s) >= 0  # a vector: the interpreter's bool vector & bool scalar is int32
        new = tl.load(x_ptr + s * x_t + chan, mask=mask & fresh, other=0.0)
        old = tl.load(cs_ptr + chan * cs_c + (W + s), mask=mask & (fresh == 0), other=0.0)
        return tl.where(fresh, new, old.to(new.dtype))

    @triton.jit
    def _conv_silu(x_ptr, cs_ptr, w_ptr, win_ptr, t, chan, mask, store, x_t, cs_c, w_c, win_t, win_c,
                   W: tl.constexpr, ROUND: tl.constexpr):
        """silu(conv) of token t on `chan`, float32, rounded as the eager path rounds; stores the
        window after token t where `store`."""
        x0 = _conv_tap(x_ptr, cs_ptr, t - W, chan, mask, x_t, cs_c, W)
        acc = x0.to(tl.float32) * tl.load(w_ptr + chan * w_c, mask=mask, other=0.0).to(tl.float32)
        for j in tl.static_range(1, W + 1):
            xj = _conv_tap(x_ptr, cs_ptr, t - W + j, chan, mask, x_t, cs_c, W)
            acc = acc + xj.to(tl.float32) * tl.load(w_ptr + chan * w_c + j, mask=mask, other=0.0).to(tl.float32)
            tl.store(win_ptr + t * win_t + chan * win_c + (j - 1), xj, mask=store)
        if ROUND:
            acc = acc.to(x0.dtype).to(tl.float32)
        y = acc / (1.0 + tl.exp(-acc))
        if ROUND:
            y = y.to(x0.dtype).to(tl.float32)
        return y

    @triton.jit
    def _qk_front(t, x_base, cs_base, w_ptr, win_base, q_chan, k_chan, mask_k, qk_store, x_t, cs_c, w_c, win_t, win_c,
                  Q_SCALE: tl.constexpr, EPS: tl.constexpr, W: tl.constexpr, ROUND: tl.constexpr):
        """Token t's q (L2-normed, scaled) and k (L2-normed) of one key head; writes their conv windows where
        `qk_store`. The one definition the fused kernel and the two-pass front share, so both round alike."""
        q = _conv_silu(x_base, cs_base, w_ptr, win_base, t, q_chan, mask_k, qk_store, x_t, cs_c, w_c, win_t, win_c, W, ROUND)
        k = _conv_silu(x_base, cs_base, w_ptr, win_base, t, k_chan, mask_k, qk_store, x_t, cs_c, w_c, win_t, win_c, W, ROUND)
        return q * tl.rsqrt(tl.sum(q * q) + EPS) * Q_SCALE, k * tl.rsqrt(tl.sum(k * k) + EPS)

    @triton.jit
    def _gates(t, b_base, a_base, b_t, a_t, neg_a, dt_bias):
        """Token t's decay exponent g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b) of one value head."""
        beta = tl.sigmoid(tl.load(b_base + t * b_t).to(tl.float32))
        ga = tl.load(a_base + t * a_t).to(tl.float32) + dt_bias
        return neg_a * tl.where(ga > 20.0, ga, tl.log(1.0 + tl.exp(ga))), beta

    @triton.jit
    def _front(t, x_base, cs_base, w_ptr, win_base, b_base, a_base, q_chan, k_chan, v_chan, mask_k, mask_v, qk_store,
               neg_a, dt_bias, x_t, cs_c, w_c, win_t, win_c, b_t, a_t,
               Q_SCALE: tl.constexpr, EPS: tl.constexpr, W: tl.constexpr, ROUND: tl.constexpr):
        """Token t's q, k, v, g and beta from the raw projections (writes its conv windows)."""
        q, k = _qk_front(t, x_base, cs_base, w_ptr, win_base, q_chan, k_chan, mask_k, qk_store, x_t, cs_c, w_c, win_t,
                         win_c, Q_SCALE, EPS, W, ROUND)
        v = _conv_silu(x_base, cs_base, w_ptr, win_base, t, v_chan, mask_v, mask_v, x_t, cs_c, w_c, win_t, win_c, W, ROUND)
        g, beta = _gates(t, b_base, a_base, b_t, a_t, neg_a, dt_bias)
        return q, k, v, g, beta

    @triton.jit
    def _gdn_fused_kernel(
        x_ptr, b_ptr, a_ptr, cs_ptr, w_ptr, alog_ptr, dtb_ptr, h0_ptr, o_ptr, st_ptr, win_ptr, in_ptr,
        x_b, x_t, b_b, b_t, a_b, a_t, cs_b, cs_c, w_c,
        h0_b, h0_h, h0_k, h0_v, o_b, o_t, o_h, st_b, st_t, st_h, st_k, win_b, win_t, win_c, in_b, in_t, in_h,
        H, REP, DK, DV, KEY_DIM,
        Q_SCALE: tl.constexpr, EPS: tl.constexpr,
        T: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ROUND: tl.constexpr,
        STATES: tl.constexpr, INPUTS: tl.constexpr,
    ):
        """One program per (batch row, value head, d_v block), as `gdn_verify`; the q/k front of a
        key head is recomputed by each of its programs (it is tiny) and its windows written by one.
        (Computing token t+1's front during token t's recurrence, as gdn_verify prefetches its
        inputs, did not make verify(8) measurably faster on the H200: docs/kernels.md.)"""
        i_bh = tl.program_id(0)
        i_v = tl.program_id(1)
        b = (i_bh // H).to(tl.int64)
        h = (i_bh % H).to(tl.int64)
        kh = h // REP
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k = offs_k < DK
        mask_v = offs_v < DV
        mask_s = mask_k[:, None] & mask_v[None, :]
        qk_store = mask_k & ((offs_k * 0 + h % REP + i_v) == 0)  # one program writes a key head's q/k windows
        q_chan = kh * DK + offs_k
        k_chan = KEY_DIM + kh * DK + offs_k
        v_chan = 2 * KEY_DIM + h * DV + offs_v

        x_base = x_ptr + b * x_b
        cs_base = cs_ptr + b * cs_b
        win_base = win_ptr + b * win_b
        st_base = st_ptr + b * st_b + h * st_h + offs_k[:, None] * st_k + offs_v[None, :]
        o_base = o_ptr + b * o_b + h * o_h
        in_base = in_ptr + b * in_b + h * in_h
        first = (offs_k * 0 + i_v) == 0  # the head's first d_v block writes its k, g and beta inputs
        neg_a = -tl.exp(tl.load(alog_ptr + h).to(tl.float32))
        dt_bias = tl.load(dtb_ptr + h).to(tl.float32)

        s = tl.load(h0_ptr + b * h0_b + h * h0_h + offs_k[:, None] * h0_k + offs_v[None, :] * h0_v,
                    mask=mask_s, other=0.0).to(tl.float32)
        b_base, a_base = b_ptr + b * b_b + h, a_ptr + b * a_b + h
        for t in range(T):
            q, k, v, g, beta = _front(t, x_base, cs_base, w_ptr, win_base, b_base, a_base, q_chan, k_chan, v_chan,
                                      mask_k, mask_v, qk_store, neg_a, dt_bias, x_t, cs_c, w_c, win_t, win_c, b_t, a_t,
                                      Q_SCALE, EPS, W, ROUND)
            if INPUTS:
                _store_inputs(in_base, t, in_t, k, v, g, beta, offs_k, offs_v, mask_k, mask_v, first, DK, DV)
            s = _token_step(s, t, q, k, v, g, beta, 1.0, o_base, st_base, o_t, st_t, offs_v, mask_v, mask_s,
                            STATES)


    @triton.jit
    def _gdn_front_kernel(
        x_ptr, b_ptr, a_ptr, cs_ptr, w_ptr, alog_ptr, dtb_ptr, q_ptr, win_ptr, in_ptr,
        x_b, x_t, b_b, b_t, a_b, a_t, cs_b, cs_c, w_c, q_b, q_t, q_h, win_b, win_t, win_c, in_b, in_t, in_h,
        T, NK, REP, DK, DV, KEY_DIM,
        Q_SCALE: tl.constexpr, EPS: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        """Program (b * T + t, j): for j < NK, key head j's q and k of token t (the same arithmetic as
        `_front`), written for each of its REP value heads, and their conv windows; for j >= NK, value head
        j - NK's v, g and beta and its windows. q goes to q_ptr, k | v | g | beta to the replay inputs."""
        pid = tl.program_id(0)
        j = tl.program_id(1)
        b = (pid // T).to(tl.int64)
        t = pid % T
        x_base = x_ptr + b * x_b
        cs_base = cs_ptr + b * cs_b
        win_base = win_ptr + b * win_b
        in_base = in_ptr + b * in_b + t * in_t
        if j < NK:
            offs_k = tl.arange(0, BK)
            mask_k = offs_k < DK
            q, k = _qk_front(t, x_base, cs_base, w_ptr, win_base, j * DK + offs_k, KEY_DIM + j * DK + offs_k, mask_k,
                             mask_k, x_t, cs_c, w_c, win_t, win_c, Q_SCALE, EPS, W, ROUND)
            for r in range(REP):
                h = (j * REP + r).to(tl.int64)
                tl.store(q_ptr + b * q_b + t * q_t + h * q_h + offs_k, q, mask=mask_k)
                tl.store(in_base + h * in_h + offs_k, k, mask=mask_k)
        else:
            h = (j - NK).to(tl.int64)
            offs_v = tl.arange(0, BV)
            mask_v = offs_v < DV
            v = _conv_silu(x_base, cs_base, w_ptr, win_base, t, 2 * KEY_DIM + h * DV + offs_v, mask_v, mask_v, x_t,
                           cs_c, w_c, win_t, win_c, W, ROUND)
            g, beta = _gates(t, b_ptr + b * b_b + h, a_ptr + b * a_b + h, b_t, a_t,
                             -tl.exp(tl.load(alog_ptr + h).to(tl.float32)), tl.load(dtb_ptr + h).to(tl.float32))
            tl.store(in_base + h * in_h + DK + offs_v, v, mask=mask_v)
            tl.store(in_base + h * in_h + DK + DV, g)
            tl.store(in_base + h * in_h + DK + DV + 1, beta)


def _check(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk, out_states, out_windows,
           out_inputs=None):
    require(mixed.dim() == 3, f"gdn_fused_verify: mixed must be [B, T, C], got {tuple(mixed.shape)}")
    B, T, C = mixed.shape
    require(b.dim() == 3 and tuple(b.shape[:2]) == (B, T),
            f"gdn_fused_verify: b must be [B={B}, T={T}, H], got {tuple(b.shape)}")
    H = b.shape[2]
    require(tuple(a.shape) == (B, T, H), f"gdn_fused_verify: a must be [B, T, H] = {(B, T, H)}, got {tuple(a.shape)}")
    require(nk >= 1 and H % nk == 0, f"gdn_fused_verify: {H} value heads are not a multiple of {nk} key heads")
    dv, rest = divmod(C - 2 * nk * dk, H)
    require(dv >= 1 and rest == 0,
            f"gdn_fused_verify: C = {C} channels do not split into 2 x {nk} x {dk} (q, k) + {H} value heads")
    require(conv_weight.dim() == 2 and conv_weight.shape[0] == C and conv_weight.shape[1] >= 2,
            f"gdn_fused_verify: conv_weight must be [C={C}, kernel], got {tuple(conv_weight.shape)}")
    W = conv_weight.shape[1] - 1
    require(tuple(conv_state.shape) == (B, C, W),
            f"gdn_fused_verify: conv_state must be [B, C, W] = {(B, C, W)}, got {tuple(conv_state.shape)}")
    require(tuple(A_log.shape) == (H,) and tuple(dt_bias.shape) == (H,),
            f"gdn_fused_verify: A_log and dt_bias must be [H={H}], got {tuple(A_log.shape)}, {tuple(dt_bias.shape)}")
    require(tuple(initial_state.shape) == (B, H, dk, dv),
            f"gdn_fused_verify: initial_state must be [B, H, d_k, d_v] = {(B, H, dk, dv)}, got {tuple(initial_state.shape)}")
    if out_states is not None:
        require(tuple(out_states.shape) == (B, T, H, dk, dv) and out_states.dtype == torch.float32,
                f"gdn_fused_verify: out_states must be float32 [B, T, H, d_k, d_v] = {(B, T, H, dk, dv)}, "
                f"got {out_states.dtype} {tuple(out_states.shape)}")
    if out_windows is not None:
        require(tuple(out_windows.shape) == (B, T, C, W) and out_windows.dtype == conv_state.dtype,
                f"gdn_fused_verify: out_windows must be {conv_state.dtype} [B, T, C, W] = {(B, T, C, W)}, "
                f"got {out_windows.dtype} {tuple(out_windows.shape)}")
    if out_inputs is not None:
        width = input_width(dk, dv)
        require(out_states is None, "gdn_fused_verify: give out_states or out_inputs, not both")
        require(tuple(out_inputs.shape) == (B, T, H, width) and out_inputs.dtype == torch.float32
                and out_inputs.stride(-1) == 1,
                f"gdn_fused_verify: out_inputs must be float32 [B, T, H, d_k + d_v + 2] = {(B, T, H, width)} "
                f"with a contiguous last dimension, got {out_inputs.dtype} {tuple(out_inputs.shape)}")
    devs = {t.device for t in (mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state)}
    require(len(devs) == 1, f"gdn_fused_verify: all inputs must be on one device, got {sorted(map(str, devs))}")
    return B, T, C, H, dv, W


def gdn_fused_verify_reference(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                               conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                               initial_state: torch.Tensor, nk: int, dk: int,
                               out_states: Optional[torch.Tensor] = None, out_windows: Optional[torch.Tensor] = None,
                               out_inputs: Optional[torch.Tensor] = None,
                               ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """The same in plain torch ops (the ground truth). Returns (o, states or None, windows)."""
    B, T, C, H, dv, W = _check(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                               out_states, out_windows, out_inputs)
    x = mixed.transpose(1, 2)
    full = torch.cat([conv_state.to(x.dtype), x], dim=-1)  # [B, C, W + T]
    w = conv_weight.float()
    acc = full[..., 0:T].float() * w[:, 0:1]
    for j in range(1, W + 1):
        acc = acc + full[..., j:j + T].float() * w[:, j:j + 1]
    y = F.silu(acc.to(x.dtype)).transpose(1, 2).float()  # [B, T, C]
    key_dim = nk * dk
    q, k, v = torch.split(y, [key_dim, key_dim, H * dv], dim=-1)
    rep = H // nk
    l2 = lambda t: t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = l2(q.reshape(B, T, nk, dk)).repeat_interleave(rep, dim=2) * dk ** -0.5
    k = l2(k.reshape(B, T, nk, dk)).repeat_interleave(rep, dim=2)
    v = v.reshape(B, T, H, dv)
    beta = b.float().sigmoid()
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    keep = out_inputs is None
    o, states = gdn_verify_reference(q, k, v, g, beta, initial_state, 1.0, out_states, keep_states=keep)
    if not keep:
        out_inputs.copy_(torch.cat([k, v, g[..., None], beta[..., None]], dim=-1))
    win = full.unfold(-1, W, 1)[:, :, 1:].permute(0, 2, 1, 3)  # [B, T, C, W]
    if out_windows is None:
        out_windows = win.to(conv_state.dtype).contiguous()
    else:
        out_windows.copy_(win)
    return o.float(), states, out_windows


def gdn_fused_verify_triton(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                            conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                            initial_state: torch.Tensor, nk: int, dk: int,
                            out_states: Optional[torch.Tensor] = None, out_windows: Optional[torch.Tensor] = None,
                            out_inputs: Optional[torch.Tensor] = None,
                            *, block_v: Optional[int] = None, num_warps: Optional[int] = None,
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """One fused launch; `block_v`/`num_warps` override the launch heuristics (benchmarks and tests)."""
    require_triton()
    B, T, C, H, dv, W = _check(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                               out_states, out_windows, out_inputs)
    for name, t in (("mixed", mixed), ("b", b), ("a", a), ("conv_state", conv_state), ("conv_weight", conv_weight)):
        require(t.stride(-1) == 1 or t.shape[-1] == 1, f"gdn_fused_verify: {name}'s last dimension must be contiguous")
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    keep = out_inputs is None  # with out_inputs no state is written: the commit replays the accepted tokens
    if keep:
        states = out_states if out_states is not None else mixed.new_empty(B, T, H, dk, dv, dtype=torch.float32)
    else:
        states = mixed.new_empty(1, 1, 1, 1, 1, dtype=torch.float32)  # a placeholder argument, never written
    inputs = out_inputs if out_inputs is not None else mixed.new_empty(1, 1, 1, 1, dtype=torch.float32)
    windows = out_windows if out_windows is not None else conv_state.new_empty(B, T, C, W)
    require(states.stride(-1) == 1 and windows.stride(-1) == 1,
            "gdn_fused_verify: out_states' and out_windows' last dimensions must be contiguous")
    o = torch.empty(B, T, H, dv, device=mixed.device, dtype=torch.float32)
    BK = max(16, next_pow2(dk))
    BV = block_v or BLOCK_V
    grid = (B * H, triton.cdiv(dv, BV))
    _gdn_fused_kernel[grid](
        mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, o, states, windows, inputs,
        mixed.stride(0), mixed.stride(1), b.stride(0), b.stride(1), a.stride(0), a.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_weight.stride(0),
        *initial_state.stride(),
        o.stride(0), o.stride(1), o.stride(2),
        states.stride(0), states.stride(1), states.stride(2), states.stride(3),
        windows.stride(0), windows.stride(1), windows.stride(2), inputs.stride(0), inputs.stride(1), inputs.stride(2),
        H, H // nk, dk, dv, nk * dk,
        # float constants as constexprs: torch.compile passes a Python float to a Triton kernel as fp64
        Q_SCALE=float(dk ** -0.5), EPS=1e-6,
        T=T, W=W, BK=BK, BV=BV, ROUND=mixed.element_size() < 4, STATES=keep, INPUTS=not keep,
        num_warps=num_warps or NUM_WARPS,
    )
    return o, (states if keep else None), windows


def gdn_fused_verify(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                     conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                     initial_state: torch.Tensor, nk: int, dk: int,
                     out_states: Optional[torch.Tensor] = None, out_windows: Optional[torch.Tensor] = None,
                     out_inputs: Optional[torch.Tensor] = None,
                     ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(o [B,T,H,d_v] fp32, states or None, windows): Triton on CUDA, the torch reference elsewhere."""
    if use_triton(mixed, initial_state):
        return gdn_fused_verify_triton(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                                       out_states, out_windows, out_inputs)
    return gdn_fused_verify_reference(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                                      out_states, out_windows, out_inputs)


def gdn_two_pass_verify_triton(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                               conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                               initial_state: torch.Tensor, nk: int, dk: int, out_inputs: torch.Tensor,
                               out_windows: Optional[torch.Tensor] = None,
                               ) -> tuple[torch.Tensor, None, torch.Tensor]:
    """The same verify as two launches: every token's front at once (`_gdn_front_kernel`, its q, k, v, g,
    beta and windows; k | v | g | beta straight into out_inputs), then `gdn_verify`'s recurrence over
    them. The fused kernel computes each token's front inside its serial token loop, which made a block
    of 8 tokens cost several times the one-token launch (docs/figures.md "The AR step and verify(8), part by
    part"); here only the recurrence is serial."""
    require_triton()
    require(out_inputs is not None, "gdn_two_pass_verify: out_inputs is required (the recurrence reads them)")
    B, T, C, H, dv, W = _check(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                               None, out_windows, out_inputs)
    for name, t in (("mixed", mixed), ("b", b), ("a", a), ("conv_state", conv_state), ("conv_weight", conv_weight)):
        require(t.stride(-1) == 1 or t.shape[-1] == 1, f"gdn_two_pass_verify: {name}'s last dimension must be contiguous")
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    windows = out_windows if out_windows is not None else conv_state.new_empty(B, T, C, W)
    require(windows.stride(-1) == 1, "gdn_two_pass_verify: out_windows' last dimension must be contiguous")
    q = torch.empty(B, T, H, dk, device=mixed.device, dtype=torch.float32)
    if B * T:
        _gdn_front_kernel[(B * T, nk + H)](
            mixed, b, a, conv_state, conv_weight, A_log, dt_bias, q, windows, out_inputs,
            mixed.stride(0), mixed.stride(1), b.stride(0), b.stride(1), a.stride(0), a.stride(1),
            conv_state.stride(0), conv_state.stride(1), conv_weight.stride(0), q.stride(0), q.stride(1), q.stride(2),
            windows.stride(0), windows.stride(1), windows.stride(2),
            out_inputs.stride(0), out_inputs.stride(1), out_inputs.stride(2),
            T, nk, H // nk, dk, dv, nk * dk,
            Q_SCALE=float(dk ** -0.5), EPS=1e-6, W=W, BK=max(16, next_pow2(dk)), BV=max(16, next_pow2(dv)),
            ROUND=mixed.element_size() < 4, num_warps=NUM_WARPS,
        )
    k, v = out_inputs[..., :dk], out_inputs[..., dk:dk + dv]
    g, beta = out_inputs[..., dk + dv], out_inputs[..., dk + dv + 1]
    o, _ = gdn_verify_triton(q, k, v, g, beta, initial_state, 1.0, keep_states=False)
    return o, None, windows


def gdn_two_pass_verify(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                        conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                        initial_state: torch.Tensor, nk: int, dk: int, out_inputs: torch.Tensor,
                        out_windows: Optional[torch.Tensor] = None,
                        ) -> tuple[torch.Tensor, None, torch.Tensor]:
    """(o [B,T,H,d_v] fp32, None, windows), the replay inputs written: two launches on CUDA, the torch
    reference elsewhere."""
    if use_triton(mixed, initial_state):
        return gdn_two_pass_verify_triton(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                                          out_inputs, out_windows)
    return gdn_fused_verify_reference(mixed, b, a, conv_state, conv_weight, A_log, dt_bias, initial_state, nk, dk,
                                      None, out_windows, out_inputs)
