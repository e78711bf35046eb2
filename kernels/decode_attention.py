"""Decode / verify attention over a static KV cache (the fast path's attention for 16-bit targets).

For every (batch row b, query head h, query row t) at absolute position p = pos[b, t]:

    o[b, h, t] = softmax(scale * q[b, h, t] . k[b, h // G, j]  for lo <= j <= p) @ v[b, h // G, lo..p]

with lo = 0, or lo = max(p + 1 - window, 0) for a sliding window; G = query heads per KV head (GQA),
scale = head_dim^-0.5. This is what `Attention.attention` computes with SDPA and a mask over the whole
buffer on the fast path. That SDPA call ran a decode query through cuDNN's prefill-shaped tiles over a
few hundred keys: most of the GPU idled while a handful of programs walked the keys (docs/kernels.md).
Figures, with their commands: docs/figures.md "Kernels".

Two kernels, as flash-decoding does it. `_attend_kernel`, one program per (b, KV head, chunk of
CHUNK keys), takes the G*T query rows of that KV head through its chunk in blocks of BLOCK_N (one
`tl.dot` for the scores, one for the values) with a float32 online softmax, and writes the chunk's
max, sum and weighted values; chunks past every row's position, or wholly before every row's window,
exit at once, so a long static buffer costs only empty programs. `_combine_kernel`, one program per
(b, KV head, query row), rescales the row's chunks to their common max and adds them, COMBINE_CHUNKS
chunks a step. A buffer of one chunk is written directly, one kernel. Chunks hold CHUNK keys up to
MAX_CHUNKS chunks a head and grow past that (`chunk_for`), so a 32k context is a few dozen chunks,
not 500. The pair is several times faster than cuDNN SDPA per layer at the 27B size; one program walking
the whole buffer was slower (serial load latency).

Inference only (no autograd), fast mode only: the result matches SDPA to rounding but its bits
follow the block split; exact mode has `exact_attention` (fixed key-block order, row-invariant).
`decode_attention_reference` is the plain-torch math (the exact kernel's reference with n = p + 1).
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton
from .exact_attention import check_attention_inputs, exact_attention_reference

BLOCK_N = 64  # keys per step of a program's loop
CHUNK = 64  # keys per program (an engine A/B chose 64 over 128 and the whole buffer: docs/kernels.md)
MAX_CHUNKS = 32  # chunks per (batch row, KV head) before chunks grow: every buffer up to 2,048 keys keeps CHUNK
PROGRAMS = 256  # or as many as fill the GPU: ~2 programs per SM of a 132-SM H100 / H200
COMBINE_CHUNKS = 16  # chunks a combine program reads per step
MAX_ROWS = 64  # G * T query rows of one KV head in one tile (the 27B verify block: 6 heads x 8 tokens = 48)
# Triton's CPU interpreter multiplies bf16 tiles wrongly (no bf16 dot): interpreted runs upcast first
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rows(pos_ptr, pos_b, pos_t, b, T, GT, WINDOW, BM: tl.constexpr):
        """Per query row r = g * T + t of one KV head: whether it exists, its t, and the keys it sees [lo, n)."""
        r = tl.arange(0, BM)
        live = r < GT
        t = r % T
        n = tl.load(pos_ptr + b * pos_b + t * pos_t, mask=live, other=-1).to(tl.int32) + 1
        lo = tl.where(WINDOW > 0, tl.maximum(n - WINDOW, 0), 0)
        return r, live, t, n, lo

    @triton.jit
    def _store_out(o_ptr, acc, l, b, h, t, live, offs_dv, o_b, o_h, o_t, DV: tl.constexpr):
        """acc / l (zeros for a row that saw no key) into o at (b, h, t), in o's dtype."""
        out = tl.where((l > 0)[:, None], acc / tl.maximum(l, 1e-30)[:, None], 0.0)
        o = o_ptr + b.to(tl.int64) * o_b + h[:, None].to(tl.int64) * o_h + t[:, None] * o_t + offs_dv[None, :]
        tl.store(o, out.to(o_ptr.dtype.element_ty), mask=live[:, None] & (offs_dv < DV)[None, :])

    @triton.jit
    def _attend_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, o_ptr,
                       q_b, q_h, q_t, k_b, k_h, k_l, v_b, v_h, v_l, pos_b, pos_t, o_b, o_h, o_t,
                       HKV, G, T, L, WINDOW, S,
                       SCALE: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                       BM: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, DIRECT: tl.constexpr,
                       IEEE: tl.constexpr):
        """Program (b * HKV + hk, c): the KV head's G*T query rows over keys c*CHUNK + [0, CHUNK), in
        blocks of BLOCK_N with a float32 online softmax. DIRECT (one chunk spans the buffer): the
        normalised output goes to o. Otherwise partials m, l [B*HKV, S, BM] and acc [B*HKV, S, BM, BDV]."""
        pid = tl.program_id(0)
        c = tl.program_id(1)
        b = pid // HKV
        hk = pid % HKV
        r, live, t, n, lo = _rows(pos_ptr, pos_b, pos_t, b, T, G * T, WINDOW, BM)
        n_max = tl.minimum(tl.max(tl.where(live, n, 0), 0), L)
        lo_min = tl.min(tl.where(live, lo, L), 0)
        h = hk * G + r // T
        offs_d = tl.arange(0, BD)
        offs_dv = tl.arange(0, BDV)
        q = tl.load(q_ptr + b.to(tl.int64) * q_b + h[:, None].to(tl.int64) * q_h + t[:, None] * q_t + offs_d[None, :],
                    mask=live[:, None] & (offs_d < D)[None, :], other=0.0)
        k_base = k_ptr + b.to(tl.int64) * k_b + hk.to(tl.int64) * k_h
        v_base = v_ptr + b.to(tl.int64) * v_b + hk.to(tl.int64) * v_h
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BDV], dtype=tl.float32)
        first = tl.maximum(c * CHUNK, (lo_min // BLOCK_N) * BLOCK_N)
        for start in range(first, tl.minimum(c * CHUNK + CHUNK, n_max), BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            read = (keys < n_max) & (keys >= lo_min)  # keys no row sees are never read
            k = tl.load(k_base + keys[:, None].to(tl.int64) * k_l + offs_d[None, :],
                        mask=read[:, None] & (offs_d < D)[None, :], other=0.0)
            v = tl.load(v_base + keys[:, None].to(tl.int64) * v_l + offs_dv[None, :],
                        mask=read[:, None] & (offs_dv < DV)[None, :], other=0.0)
            if IEEE:
                scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            seen = (keys[None, :] < n[:, None]) & (keys[None, :] >= lo[:, None]) & live[:, None]
            scores = tl.where(seen, scores * SCALE, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)  # 0 before a row's first key
            p = tl.where(seen, tl.exp(scores - m_safe[:, None]), 0.0)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        if DIRECT:
            _store_out(o_ptr, acc, l_i, b, h, t, live, offs_dv, o_b, o_h, o_t, DV)
        else:
            part = pid.to(tl.int64) * S + c
            tl.store(m_ptr + part * BM + r, m_i)
            tl.store(l_ptr + part * BM + r, l_i)
            tl.store(acc_ptr + (part * BM + r[:, None]) * BDV + offs_dv[None, :], acc)

    @triton.jit
    def _combine_kernel(pos_ptr, m_ptr, l_ptr, acc_ptr, o_ptr,
                        o_b, o_h, o_t, pos_b, pos_t,
                        HKV, G, T, WINDOW, S,
                        DV: tl.constexpr, BDV: tl.constexpr, BM: tl.constexpr, CHUNK: tl.constexpr,
                        SB: tl.constexpr):
        """Program (b * HKV + hk, r): query row r's chunks [lo // CHUNK, ceil(n / CHUNK)) rescaled to their
        common max and summed, SB chunks per step (a long context's many chunks in few dependent steps)."""
        pid = tl.program_id(0)
        r = tl.program_id(1)
        b = pid // HKV
        hk = pid % HKV
        t = r % T
        n = tl.load(pos_ptr + b * pos_b + t * pos_t).to(tl.int32) + 1
        lo = tl.where(WINDOW > 0, tl.maximum(n - WINDOW, 0), 0)
        first = lo // CHUNK
        last = tl.minimum((n + CHUNK - 1) // CHUNK, S)  # one past the row's last chunk
        offs_s = tl.arange(0, SB)
        offs_dv = tl.arange(0, BDV)
        row = pid.to(tl.int64) * S
        m_top = tl.full([SB], float("-inf"), tl.float32)
        for s0 in range(first, last, SB):
            s = s0 + offs_s
            m_top = tl.maximum(m_top, tl.load(m_ptr + (row + s) * BM + r, mask=s < last, other=float("-inf")))
        m_all = tl.max(m_top, 0)
        m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
        l_sum = tl.zeros([SB], dtype=tl.float32)
        acc = tl.zeros([BDV], dtype=tl.float32)
        for s0 in range(first, last, SB):
            s = s0 + offs_s
            use = s < last
            w = tl.exp(tl.load(m_ptr + (row + s) * BM + r, mask=use, other=float("-inf")) - m_all)
            l_sum += w * tl.load(l_ptr + (row + s) * BM + r, mask=use, other=0.0)
            a = tl.load(acc_ptr + ((row + s)[:, None] * BM + r) * BDV + offs_dv[None, :], mask=use[:, None],
                        other=0.0)
            acc += tl.sum(w[:, None] * a, 0)
        l = tl.sum(l_sum, 0)
        out = tl.where(l > 0, acc / tl.maximum(l, 1e-30), 0.0)
        o = o_ptr + b.to(tl.int64) * o_b + (hk * G + r // T).to(tl.int64) * o_h + t * o_t + offs_dv
        tl.store(o, out.to(o_ptr.dtype.element_ty), mask=offs_dv < DV)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, window: int) -> torch.Tensor:
    """Validate; returns pos as [B, T] (a [T] tensor is shared by every batch row)."""
    return check_attention_inputs("decode_attention", q, k, v, pos, "pos", window)


def chunk_for(keys: int, heads: int, block_n: int = BLOCK_N) -> int:
    """Keys per program for a buffer of `keys` positions and `heads` = batch rows x KV heads: CHUNK, or at
    long contexts the smallest multiple of `block_n` that keeps the chunks per head within
    max(MAX_CHUNKS, PROGRAMS / heads). With fixed 64-key chunks a 32k context is 500+ chunks a head, whose
    partials the combine walked one at a time: the 27B's AR step then grew far more from 256 to 32k keys
    than the extra K/V it reads (issue 46). With growing chunks it stays near its bound at every length
    (docs/figures.md "Batch-1 decoding against the context length")."""
    most = max(MAX_CHUNKS, -(-PROGRAMS // max(heads, 1)))
    chunk = max(CHUNK, -(-keys // most))
    return -(-chunk // block_n) * block_n


def fits(n_heads: int, n_kv_heads: int, n_queries: int) -> bool:
    """Whether one KV head's query rows (query heads per KV head x queries) fit the kernel's tile."""
    return n_kv_heads > 0 and n_heads % n_kv_heads == 0 and 0 < n_heads // n_kv_heads * n_queries <= MAX_ROWS


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                               window: int = 0) -> torch.Tensor:
    """Plain torch, float32 inside: [B, H_q, T, d_v] in q's dtype."""
    pos = _check(q, k, v, pos, window)
    return exact_attention_reference(q, k, v, pos + 1, window=int(window))


def decode_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                            window: int = 0, *, block_n: int = BLOCK_N, chunk: Optional[int] = None,
                            num_warps: Optional[int] = None) -> torch.Tensor:
    """The Triton path (no autograd); returns a [B, H_q, T, d_v] view of a [B, T, H_q, d_v] tensor
    (the layout the output gate and o_proj read). `chunk` (a multiple of `block_n`, default CHUNK) is
    the keys per program."""
    require_triton()
    pos = _check(q, k, v, pos, window)
    B, HQ, T, D = q.shape
    HKV, L, DV = k.shape[1], k.shape[2], v.shape[3]
    G = HQ // HKV
    require(G * T <= MAX_ROWS, f"decode_attention: at most {MAX_ROWS} query rows per KV head, got {G} x {T}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.stride(-1) == 1, f"decode_attention: {name}'s last dimension must be contiguous")
    o = torch.empty(B, T, HQ, DV, device=q.device, dtype=q.dtype)  # written whole; returned transposed
    if o.numel() == 0:
        return o.transpose(1, 2)
    BM, BD, BDV = max(16, next_pow2(G * T)), max(16, next_pow2(D)), max(16, next_pow2(DV))
    num_warps = num_warps or (8 if BM * BDV >= 64 * 256 else 4)  # the [BM, d_v] fp32 accumulator in registers
    chunk = chunk or chunk_for(L, B * HKV, block_n)
    require(chunk % block_n == 0, f"decode_attention: chunk ({chunk}) must be a multiple of block_n ({block_n})")
    S = triton.cdiv(L, chunk)
    direct = S == 1
    m = torch.empty(0 if direct else B * HKV * S * BM, device=q.device, dtype=torch.float32)
    lsum = torch.empty_like(m)
    acc = torch.empty(0 if direct else B * HKV * S * BM * BDV, device=q.device, dtype=torch.float32)
    ieee = q.dtype == torch.float32 or _INTERPRETED
    _attend_kernel[(B * HKV, S)](
        q, k, v, pos, m, lsum, acc, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), pos.stride(0), pos.stride(1), o.stride(0), o.stride(2), o.stride(1),
        HKV, G, T, L, int(window), S,
        # the scale as a constexpr: torch.compile passes a Python float to a Triton kernel as fp64
        SCALE=float(D ** -0.5), D=D, DV=DV, BD=BD, BDV=BDV, BM=BM, BLOCK_N=block_n, CHUNK=chunk, DIRECT=direct,
        IEEE=ieee, num_warps=num_warps, num_stages=2,
    )
    if not direct:
        _combine_kernel[(B * HKV, G * T)](
            pos, m, lsum, acc, o, o.stride(0), o.stride(2), o.stride(1), pos.stride(0), pos.stride(1),
            HKV, G, T, int(window), S, DV=DV, BDV=BDV, BM=BM, CHUNK=chunk, SB=COMBINE_CHUNKS, num_warps=4,
        )
    return o.transpose(1, 2)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     window: int = 0) -> torch.Tensor:
    """Dispatch (inference): Triton on CUDA, the reference elsewhere.

    q [B, H_q, T, d]; k, v the cache buffers [B, H_kv, L, d | d_v] (key j at position j); pos [T] or
    [B, T] integer absolute positions of the queries. Returns [B, H_q, T, d_v]."""
    if use_triton(q, k, v, pos):
        return decode_attention_triton(q, k, v, pos, window)
    return decode_attention_reference(q, k, v, pos, window)
