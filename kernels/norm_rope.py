"""Per-head RMSNorm then rotary, in one kernel: the q/k path of DSpark's draft layers.

y = rotate(weight * (x / rms(x)).to(dtype), cos, sin) over each head's row of `head_dim` channels,
with Qwen3's roundings: the normalised row is rounded to x's dtype, then scaled in that dtype (as
`rmsnorm`'s `cast_first`), and the rotation `y * cos + rotate_half(y) * sin` rounds each product and
the sum, as the torch ops do. `rotate_half(y) = [-y2, y1]` for the halves y1, y2 of the row; the
tables `cos`, `sin` [B, N, head_dim] (one row per token, shared by the heads) already carry any
scaling (yarn's attention factor).

In the draft step's graph one launch would replace about fourteen torch kernels per rotation (the
norm's and the rotation's). Nothing calls it yet: its CUDA test failed on an H100 (kernels/NOTES.md
says what changed since and what to run before the drafter's `ContextAttention._rotated` uses it).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton
from .rmsnorm import rms_norm_reference

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, H, N, xs_b, xs_n, xs_h, cs_b, cs_n, ss_b, ss_n,
                          ys_b, ys_n, ys_h, n_cols, eps, D: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)  # one program per (row b, token n, head h)
        h = pid % H
        b = pid // H // N
        n = (pid // H) % N
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        lower = cols < D // 2
        partner = tl.where(lower, cols + D // 2, cols - D // 2)  # rotate_half's source channel
        sign = tl.where(lower, -1.0, 1.0)
        xrow = x_ptr + b * xs_b + n * xs_n + h * xs_h
        x = tl.load(xrow + cols, mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(xrow + partner, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + b * cs_b + n * cs_n + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + b * ss_b + n * ss_n + cols, mask=mask, other=0.0).to(tl.float32)
        out_ty = y_ptr.dtype.element_ty
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)  # as rmsnorm's kernel: the same bits
        y = (x * inv).to(out_ty).to(tl.float32) * w  # the norm: two roundings (Qwen3)
        y = y.to(out_ty).to(tl.float32)
        yp = (xp * inv).to(out_ty).to(tl.float32) * wp
        yp = yp.to(out_ty).to(tl.float32)
        a = (y * c).to(out_ty).to(tl.float32)  # the rotation: each product rounded, then the sum
        r = (sign * yp * s).to(out_ty).to(tl.float32)
        tl.store(y_ptr + b * ys_b + n * ys_n + h * ys_h + cols, a + r, mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    require(x.dim() == 4, f"norm_rope: x must be [B, N, heads, head_dim], got shape {tuple(x.shape)}")
    B, N, _, D = x.shape
    require(D % 2 == 0, f"norm_rope: head_dim must be even (rotate_half), got {D}")
    require(weight.dim() == 1 and weight.shape[0] == D, f"norm_rope: weight must be [{D}], got {tuple(weight.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        require(t.dim() == 3 and t.shape[1:] == (N, D) and t.shape[0] in (1, B),
                f"norm_rope: {name} must be [{B} or 1, {N}, {D}], got {tuple(t.shape)}")
        require(t.dtype == x.dtype, f"norm_rope: {name} must be {x.dtype} (x's dtype), got {t.dtype}")
    require(weight.dtype == x.dtype, f"norm_rope: the weight must be {x.dtype} (x's dtype), got {weight.dtype}")
    require(len({x.device, weight.device, cos.device, sin.device}) == 1,
            f"norm_rope: x, weight, cos and sin must share a device, got {x.device}, {weight.device}, "
            f"{cos.device}, {sin.device}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[-x2, x1] for the last dimension's halves x1, x2."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        eps: float = 1e-6) -> torch.Tensor:
    """Plain torch (differentiable): x [B, N, H, D], weight [D], cos/sin [B or 1, N, D] -> [B, N, H, D]."""
    _check(x, weight, cos, sin)
    y = rms_norm_reference(x, weight, eps, 0.0, cast_first=True)
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    return y * c + rotate_half(y) * s


def norm_rope_triton(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     eps: float = 1e-6) -> torch.Tensor:
    """One program per head row (no autograd); the output is contiguous [B, N, H, D]."""
    require_triton()
    _check(x, weight, cos, sin)
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    B, N, H, D = x.shape
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    rows = B * N * H
    block = max(16, next_pow2(D))
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)  # rmsnorm's layout, so its row sum's order
    if rows:
        cb = cos.stride(0) if cos.shape[0] > 1 else 0
        sb = sin.stride(0) if sin.shape[0] > 1 else 0
        _norm_rope_kernel[(rows,)](x, weight.contiguous(), cos, sin, y, H, N, x.stride(0), x.stride(1), x.stride(2),
                                   cb, cos.stride(1), sb, sin.stride(1), y.stride(0), y.stride(1), y.stride(2),
                                   D, float(eps), D=D, BLOCK=block, num_warps=warps)
    return y


def norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              eps: float = 1e-6) -> torch.Tensor:
    """Dispatch: Triton on CUDA when no gradient is needed; torch otherwise."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, cos, sin))
    if not needs_grad and use_triton(x, weight, cos, sin):
        return norm_rope_triton(x, weight, cos, sin, eps)
    return norm_rope_reference(x, weight, cos, sin, eps)
