"""Rotary position embedding of the draft layers' queries and keys, as torch rounds it, in one launch.

    y = x * cos + rotate(x) * signed_sin,   rotate(x) = [x2, x1]  (x = [x1, x2] over the head dim)

with `cos` and `signed_sin` the drafter's tables (`ready.drafter.layers.Rotary`: the sign of rotate-half
sits in the sin table). Torch runs it as four kernels a call (two products, the cat, the add), each
rounding to x's dtype; the draft step makes 15 such calls (queries, block keys and context keys of five
layers): about 60 small kernels a draft step (docs/kernels.md "Rotary"). Here one program
per (batch row, position) rotates every head of it, rounding each product and the sum to x's dtype as
torch does, so the result has torch's bits on the GPU (float32 inside; no fused multiply-add).

The draft step then writes each layer's rotated keys and its values into the context buffers
[B, H_kv, cap, hd] at the block's rows (and the re-projected context rows at theirs): two scatter or
index_copy kernels a call, 20 a step. `rope_store` rotates the keys and writes both there in the same
launch.

- `rope_reference`: plain torch, the formula above (the drafter's `apply_rope`).
- `rope_triton`: the one launch (no autograd); returns a [B, H, N, hd] view of a [B, N, H, hd] tensor.
- `rope`: dispatch, Triton on CUDA, the reference elsewhere.
- `rope_store_reference` / `rope_store_triton` / `rope_store`: rotate k and write it and v into the
  buffers at `rows` [1 or B, N] (k_buf[b, :, rows[b, n]] = rope(k)[b, :, n]; v likewise), nothing returned.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, v_ptr, vo_ptr, rows_ptr, H, N, x_b, x_h, x_n, c_b, c_n, s_b, s_n,
                     y_b, y_h, y_n, v_b, v_h, v_n, vo_b, vo_h, vo_n, r_b,
                     HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ROUND: tl.constexpr,
                     ROWS: tl.constexpr, COPY_V: tl.constexpr):
        """Program (b, n): every head of x at (b, n) rotated into y at row n, or with ROWS at row
        rows[b, n] of a buffer; with COPY_V, v's heads at (b, n) copied to vo at that row too."""
        pid = tl.program_id(0)
        b = (pid // N).to(tl.int64)
        n = (pid % N).to(tl.int64)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        in_d = d < 2 * HALF
        mask = (h < H) & in_d
        row = x_ptr + b * x_b + n * x_n + h * x_h
        x = tl.load(row + d, mask=mask, other=0.0)
        xr = tl.load(row + (d + HALF) % (2 * HALF), mask=mask, other=0.0)  # [x2, x1]
        c = tl.load(cos_ptr + b * c_b + n * c_n + d, mask=in_d, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + b * s_b + n * s_n + d, mask=in_d, other=0.0).to(tl.float32)
        p = x.to(tl.float32) * c
        q = xr.to(tl.float32) * s
        if ROUND:  # a 16-bit x: torch rounds each product to x's dtype before the add
            p = p.to(x.dtype, fp_downcast_rounding="rtne").to(tl.float32)
            q = q.to(x.dtype, fp_downcast_rounding="rtne").to(tl.float32)
        y = (p + q).to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        at = n
        if ROWS:
            at = tl.load(rows_ptr + b * r_b + n).to(tl.int64)
        tl.store(y_ptr + b * y_b + at * y_n + h * y_h + d, y, mask=mask)
        if COPY_V:
            v = tl.load(v_ptr + b * v_b + n * v_n + h * v_h + d, mask=mask, other=0.0)
            tl.store(vo_ptr + b * vo_b + at * vo_n + h * vo_h + d, v, mask=mask)


def _check(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    require(x.dim() == 4, f"rope: x must be [B, H, N, head_dim], got {tuple(x.shape)}")
    B, _, N, hd = x.shape
    for name, t in (("cos", cos), ("signed_sin", signed_sin)):
        require(t.dim() == 3 and t.shape[1:] == (N, hd) and t.shape[0] in (1, B),
                f"rope: {name} must be [B, N, head_dim] = [{B}, {N}, {hd}], got {tuple(t.shape)}")
        require(t.device == x.device, f"rope: x on {x.device} but {name} on {t.device}")
    require(hd % 2 == 0, f"rope: head_dim must be even, got {hd}")


def rope_reference(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Plain torch: x cos + [x2, x1] signed_sin, over tables [B, N, hd] broadcast over the heads."""
    _check(x, cos, signed_sin)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.unsqueeze(1) + torch.cat([x2, x1], dim=-1) * signed_sin.unsqueeze(1)


def _check_triton(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    require(t.stride(-1) == 1, f"rope: {name}'s last dimension must be contiguous")
    require(t.dtype == x.dtype, f"rope_triton: {name} must have x's dtype {x.dtype}, got {t.dtype}")


def _launch(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, y: torch.Tensor, y_b: int, y_h: int,
            y_n: int, v: Optional[torch.Tensor] = None, v_out: Optional[torch.Tensor] = None,
            rows: Optional[torch.Tensor] = None) -> None:
    """One program per (batch row, position) of x [B, H, N, hd]; y's strides (batch, head, row) given."""
    B, H, N, hd = x.shape
    cb = cos.stride(0) if cos.shape[0] == B else 0
    sb = signed_sin.stride(0) if signed_sin.shape[0] == B else 0
    vs = (v.stride(0), v.stride(1), v.stride(2)) if v is not None else (0, 0, 0)
    vos = (v_out.stride(0), v_out.stride(1), v_out.stride(2)) if v_out is not None else (0, 0, 0)
    r_b = (rows.stride(0) if rows.shape[0] == B else 0) if rows is not None else 0
    _rope_kernel[(B * N,)](x, cos, signed_sin, y, x if v is None else v, y if v_out is None else v_out,
                           x if rows is None else rows, H, N, x.stride(0), x.stride(1), x.stride(2), cb,
                           cos.stride(1), sb, signed_sin.stride(1), y_b, y_h, y_n, *vs, *vos, r_b,
                           HALF=hd // 2, BLOCK_H=next_pow2(H), BLOCK_D=max(16, next_pow2(hd)),
                           ROUND=x.element_size() == 2, ROWS=rows is not None, COPY_V=v is not None,
                           num_warps=4, enable_fp_fusion=False)


def rope_triton(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The one launch: every head of a (batch row, position) per program."""
    require_triton()
    _check(x, cos, signed_sin)
    B, H, N, hd = x.shape
    for name, t in (("x", x), ("cos", cos), ("signed_sin", signed_sin)):
        _check_triton(name, t, x)
    y = torch.empty(B, N, H, hd, device=x.device, dtype=x.dtype)
    if y.numel():
        _launch(x, cos, signed_sin, y, y.stride(0), y.stride(2), y.stride(1))
    return y.transpose(1, 2)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, N, hd] by the tables [B, N, hd]: Triton on CUDA, torch elsewhere."""
    if use_triton(x, cos, signed_sin):
        return rope_triton(x, cos, signed_sin)
    return rope_reference(x, cos, signed_sin)


def _check_store(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_buf: torch.Tensor,
                 v_buf: torch.Tensor, rows: torch.Tensor) -> None:
    _check(k, cos, signed_sin)
    B, H, N, hd = k.shape
    require(v.shape == k.shape, f"rope_store: v must be k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    for name, t in (("k_buf", k_buf), ("v_buf", v_buf)):
        require(t.dim() == 4 and t.shape[0] == B and t.shape[1] == H and t.shape[3] == hd,
                f"rope_store: {name} must be [B, H, cap, head_dim] = [{B}, {H}, cap, {hd}], got {tuple(t.shape)}")
        require(t.dtype == k.dtype and t.device == k.device,
                f"rope_store: {name} must be {k.dtype} on {k.device}, got {t.dtype} on {t.device}")
    require(rows.dim() == 2 and rows.shape[1] == N and rows.shape[0] in (1, B) and rows.dtype == torch.int64,
            f"rope_store: rows must be int64 [1 or B, N] = [.., {N}], got {rows.dtype} {tuple(rows.shape)}")


def rope_store_reference(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                         k_buf: torch.Tensor, v_buf: torch.Tensor, rows: torch.Tensor) -> None:
    """Plain torch: the rotated k and v scattered into the buffers at rows (the ops rope_store replaces)."""
    _check_store(k, v, cos, signed_sin, k_buf, v_buf, rows)
    idx = rows[:, None, :, None].expand(k.shape)
    k_buf.scatter_(2, idx, rope_reference(k, cos, signed_sin))
    v_buf.scatter_(2, idx, v)


def rope_store_triton(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                      k_buf: torch.Tensor, v_buf: torch.Tensor, rows: torch.Tensor) -> None:
    """The one launch: rotate k and write it and v straight into the buffers' rows."""
    require_triton()
    _check_store(k, v, cos, signed_sin, k_buf, v_buf, rows)
    for name, t in (("k", k), ("v", v), ("cos", cos), ("signed_sin", signed_sin), ("k_buf", k_buf),
                    ("v_buf", v_buf)):
        _check_triton(name, t, k)
    if k.numel():
        _launch(k, cos, signed_sin, k_buf, k_buf.stride(0), k_buf.stride(1), k_buf.stride(2), v, v_buf, rows)


def rope_store(k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_buf: torch.Tensor,
               v_buf: torch.Tensor, rows: torch.Tensor) -> None:
    """Rotate k [B, H, N, hd] and write it and v into k_buf / v_buf [B, H, cap, hd] at rows [1 or B, N]:
    Triton on CUDA, torch elsewhere."""
    if use_triton(k, v, cos, signed_sin, k_buf, v_buf):
        rope_store_triton(k, v, cos, signed_sin, k_buf, v_buf, rows)
    else:
        rope_store_reference(k, v, cos, signed_sin, k_buf, v_buf, rows)
