"""Gated delta rule, the GDN token mixer: a chunked form for prefill/training and a recurrent one.

Per value head, with q and k L2-normalised and q scaled by d_k^-0.5 (Hugging Face layout,
state S is [d_k, d_v]):

    S_t = exp(g_t) S_{t-1};   S_t = S_t + k_t (beta_t (v_t - S_t^T k_t))^T;   o_t = S_t^T q_t

Inputs here are head-major: q, k [B, H, T, d_k], v [B, H, T, d_v], g, beta [B, H, T], with key
heads already repeated to the value heads. Everything runs in fp32.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    out_states: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token recurrence (verify and decode; the reference for the chunked form).

    Returns o [B, H, T, d_v] and the final state [B, H, d_k, d_v]; writes the state after every
    token into `out_states` [T, B, H, d_k, d_v] when given (what a commit installs; token-major, so
    each step's sum lands in place).
    """
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    S = q.new_zeros(B, H, dk, dv) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        kt = k[:, :, t]
        delta = (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, kt)) * beta[:, :, t, None]
        # the new state goes straight into out_states when given (the same sum, no extra copy)
        S = torch.add(S, kt[..., :, None] * delta[..., None, :], out=None if out_states is None else out_states[t])
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))
    return torch.stack(outs, dim=2), S


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
    chunk_size: int = 64,
    state_positions: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Chunked (UT-transform) form: a few matmuls per chunk, one Python step per chunk.

    Returns o [B, H, T, d_v], the final state [B, H, d_k, d_v], and, when `state_positions`
    [B, A] is given, the state right after each of those tokens [B, A, H, d_k, d_v].
    """
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk_size
    pad = (C - T % C) % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q, k, v))
    g, beta = g.reshape(B, H, N, C), beta.reshape(B, H, N, C)

    cum = g.cumsum(-1)  # log decay from chunk start to position i (inclusive)
    lower_incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower_incl, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    # (I + strictly_lower(beta K K^T * Gamma)) solves the within-chunk delta-rule updates at once
    system = (k_beta @ k.transpose(-1, -2)) * gamma
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * gamma
    q_dec = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    end_decay = cum[..., -1].exp()[..., None, None]

    S = q.new_zeros(B, H, dk, dv) if initial_state is None else initial_state.float()
    outs, starts, v_news = [], [], []
    for n in range(N):
        v_new = u[:, :, n] - w[:, :, n] @ S
        outs.append(q_dec[:, :, n] @ S + attn[:, :, n] @ v_new)
        if state_positions is not None:
            starts.append(S)
            v_news.append(v_new)
        S = S * end_decay[:, :, n] + k_to_end[:, :, n].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, H, N * C, dv)[:, :, :T]

    at = None
    if state_positions is not None:
        at = _states_at(state_positions, torch.stack(starts, 2), torch.stack(v_news, 2), k, cum, C)
    return o, S, at


def _states_at(pos: torch.Tensor, starts: torch.Tensor, v_new: torch.Tensor, k: torch.Tensor, cum: torch.Tensor, C: int) -> torch.Tensor:
    """State after token `pos` = decayed chunk-start state + the chunk's updates up to `pos`."""
    B, H, N, _, dk = k.shape
    A = pos.shape[1]
    c, o = pos // C, pos % C  # [B, A]
    bidx = torch.arange(B, device=pos.device)[:, None]
    S0 = starts.permute(0, 2, 1, 3, 4)[bidx, c]  # [B, A, H, dk, dv]
    kc = k.permute(0, 2, 1, 3, 4)[bidx, c]  # [B, A, H, C, dk]
    vc = v_new.permute(0, 2, 1, 3, 4)[bidx, c]  # [B, A, H, C, dv]
    cumc = cum.permute(0, 2, 1, 3)[bidx, c]  # [B, A, H, C]
    cum_o = cumc.gather(-1, o[:, :, None, None].expand(B, A, H, 1))  # [B, A, H, 1]
    idx = torch.arange(C, device=pos.device)
    later = idx > o[:, :, None, None]  # tokens of the chunk after `pos` do not count
    weight = (cum_o - cumc).masked_fill(later, float("-inf")).exp()  # [B, A, H, C]
    return cum_o.exp()[..., None] * S0 + torch.einsum("bahc,bahck,bahcv->bahkv", weight, kc, vc)
