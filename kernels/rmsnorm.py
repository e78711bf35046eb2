"""RMSNorm, Qwen3.5 style: y = x * rsqrt(mean(x^2) + eps) * (offset + weight), computed in float32.

`offset = 1` is Qwen3.5's zero-centred weight (the stored weight is w - 1); `offset = 0` is the
classic RMSNorm. The result has x's dtype. `cast_first` is Qwen3's (and DSpark's draft layers')
order: x * rsqrt(...) is rounded to x's dtype first, then multiplied by the weight in that dtype,
y = (offset + weight) * (x / rms(x)).to(dtype), two roundings where the default has one.

The Triton kernel (one program per row, the whole row in registers) is used by `rms_norm` only
where the benchmark showed it beats torch (see `PREFER_TRITON` and benchmarks/kernels.py), and only
without autograd (the drafter trains through the torch op).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton

# Whether the dispatch uses Triton: yes, it is faster than the torch ops and F.rms_norm under CUDA graphs
# (docs/figures.md "Kernels").
PREFER_TRITON = True

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, x_row, y_row, N, eps, offset, BLOCK: tl.constexpr,
                         CAST_FIRST: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)
        if CAST_FIRST:  # round the normalised row to the output dtype, then scale (the product rounds again)
            y = (x * inv).to(y_ptr.dtype.element_ty).to(tl.float32) * (offset + w)
        else:
            y = x * inv * (offset + w)
        tl.store(y_ptr + row * y_row + cols, y, mask=mask)


def _check(x: torch.Tensor, weight: torch.Tensor, cast_first: bool = False) -> None:
    require(x.dim() >= 1 and weight.dim() == 1 and weight.shape[0] == x.shape[-1],
            f"rms_norm: weight must be [{x.shape[-1] if x.dim() else '?'}] (x's last dim), got {tuple(weight.shape)}")
    require(not cast_first or weight.dtype == x.dtype,
            f"rms_norm: cast_first scales in x's dtype, so the weight must be {x.dtype}, got {weight.dtype}")
    require(x.device == weight.device, f"rms_norm: x on {x.device} but weight on {weight.device}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 1.0,
                       cast_first: bool = False) -> torch.Tensor:
    """Plain torch, float32 inside (differentiable)."""
    _check(x, weight, cast_first)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if cast_first:
        return (offset + weight) * y.to(x.dtype)
    return (y * (offset + weight.float())).to(x.dtype)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 1.0,
                    cast_first: bool = False) -> torch.Tensor:
    """One program per row (no autograd)."""
    require_triton()
    _check(x, weight, cast_first)
    N = x.shape[-1]
    x2 = x.reshape(-1, N)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=x.dtype)
    BLOCK = max(16, next_pow2(N))
    warps = 4 if BLOCK <= 2048 else (8 if BLOCK <= 8192 else 16)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, x2.stride(0), y.stride(0), N, float(eps),
                                         float(offset), BLOCK=BLOCK, CAST_FIRST=bool(cast_first), num_warps=warps)
    return y.reshape(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 1.0,
             cast_first: bool = False) -> torch.Tensor:
    """Dispatch: Triton on CUDA when it wins (PREFER_TRITON) and no gradient is needed; torch otherwise."""
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if PREFER_TRITON and not needs_grad and use_triton(x, weight):
        return rms_norm_triton(x, weight, eps, offset, cast_first)
    return rms_norm_reference(x, weight, eps, offset, cast_first)
