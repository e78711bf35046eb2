"""Row norm with a reduction order that depends on the row length only (the target's exact mode).

    y = x * rsqrt(s + eps) * (offset + weight),   s = sum(x^2) / D   (mean=True, RMSNorm)
                                                  s = sum(x^2)       (mean=False, L2 norm)

computed in float32 and cast to `out_dtype` (default: x's dtype); `weight=None` drops the last
factor. Every row is reduced on its own, in an order fixed by D alone, so a row gives the same bits
whether it is normalised alone (the AR step, M = 1) or among K+1 rows (verify): torch's reductions
and torch.compile's do not promise that (their split and tile depend on how many rows there are).

- `row_norm_reference`: plain torch; the sum of squares is a pairwise tree of elementwise adds
  over the row zero-padded to a power of two (halves added until one is left), so it is
  row-invariant on any device, CPU included (elementwise adds round the same in every code path).
- `row_norm_triton`: one program per row, the whole row in registers, `tl.sum` over a block of
  next_pow2(D) with a warp count chosen from D: same order for any number of rows.
- `row_norm`: dispatch, Triton on CUDA, the reference elsewhere; `torch.ops.ready_kernels.row_norm`
  is the same as an opaque custom op (torch.compile must not re-tile the reduction).

The two implementations agree to float32 rounding, not bit for bit: exactness is a property of
each path against itself across row counts, which is what verify vs step needs.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _row_norm_kernel(x_ptr, w_ptr, y_ptr, x_row, y_row, N, inv_n, eps, offset,
                         HAS_W: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * x_row + cols, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(x * x, 0) * inv_n
        y = x * (1.0 / tl.sqrt(s + eps))
        if HAS_W:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = y * (offset + w)
        tl.store(y_ptr + row * y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, weight: Optional[torch.Tensor]) -> None:
    require(x.dim() >= 1 and x.shape[-1] > 0, f"row_norm: x must have a non-empty last dim, got {tuple(x.shape)}")
    if weight is not None:
        require(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                f"row_norm: weight must be [{x.shape[-1]}] (x's last dim), got {tuple(weight.shape)}")
        require(weight.device == x.device, f"row_norm: x on {x.device} but weight on {weight.device}")


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim as a pairwise tree of elementwise adds (zero-padded to a power of two):
    the same order, and so the same bits, for a row whatever the other dims are."""
    n = t.shape[-1]
    p = next_pow2(n)
    if p != n:
        t = F.pad(t, (0, p - n))
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[..., :h] + t[..., h:]
    return t


def row_norm_reference(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                       offset: float = 0.0, mean: bool = True, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Plain torch, float32 inside, row-invariant (tree sum)."""
    _check(x, weight)
    xf = x.float()
    s = tree_sum(xf * xf)
    if mean:
        s = s * (1.0 / x.shape[-1])
    y = xf * (1.0 / torch.sqrt(s + eps))
    if weight is not None:
        y = y * (offset + weight.float())
    return y.to(out_dtype or x.dtype)


def row_norm_triton(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6,
                    offset: float = 0.0, mean: bool = True, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """One program per row (no autograd)."""
    require_triton()
    _check(x, weight)
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=out_dtype or x.dtype)
    BLOCK = max(16, next_pow2(N))
    warps = 1 if BLOCK <= 256 else 4 if BLOCK <= 2048 else (8 if BLOCK <= 8192 else 16)
    w = weight.contiguous() if weight is not None else x2  # any pointer when HAS_W is off
    if x2.shape[0] > 0:
        _row_norm_kernel[(x2.shape[0],)](x2, w, y, x2.stride(0), y.stride(0), N, 1.0 / N if mean else 1.0,
                                         float(eps), float(offset), HAS_W=weight is not None, BLOCK=BLOCK,
                                         num_warps=warps, enable_fp_fusion=True)  # pinned: Triton 3.10 changes the default
    return y.reshape(x.shape)


@torch.library.custom_op("ready_kernels::row_norm", mutates_args=())
def _row_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float, mean: bool,
                 out_dtype: torch.dtype) -> torch.Tensor:
    if use_triton(x):
        return row_norm_triton(x, weight, eps, offset, mean, out_dtype)
    return row_norm_reference(x, weight, eps, offset, mean, out_dtype).contiguous()  # the fake's layout


@_row_norm_op.register_fake
def _(x, weight, eps, offset, mean, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


def row_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, offset: float = 0.0,
             mean: bool = True, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Dispatch (inference): Triton on CUDA, the tree-sum reference elsewhere; opaque to torch.compile."""
    out_dtype = out_dtype or x.dtype
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.row_norm(x, weight, eps, offset, mean, out_dtype)
    return _row_norm_op(x, weight, eps, offset, mean, out_dtype)
