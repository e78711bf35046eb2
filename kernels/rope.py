"""Rotary position embedding of the draft layers' queries and keys, as torch rounds it, in one launch.

    y = x * cos + rotate(x) * signed_sin,   rotate(x) = [x2, x1]  (x = [x1, x2] over the head dim)

with `cos` and `signed_sin` the drafter's tables (`ready.drafter.layers.Rotary`: the sign of rotate-half
sits in the sin table). Torch runs it as four kernels a call (two products, the cat, the add), each
rounding to x's dtype; the draft step makes 15 such calls (queries, block keys and context keys of five
layers): about 60 small kernels of a 3.1 ms step at B = 1 (H100; docs/benchmarks.md). Here one program
per (batch row, position) rotates every head of it, rounding each product and the sum to x's dtype as
torch does, so the result has torch's bits on the GPU (float32 inside; no fused multiply-add).

- `rope_reference`: plain torch, the formula above (the drafter's `apply_rope`).
- `rope_triton`: the one launch (no autograd); returns a [B, H, N, hd] view of a [B, N, H, hd] tensor.
- `rope`: dispatch, Triton on CUDA, the reference elsewhere.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, N, x_b, x_h, x_n, c_b, c_n, s_b, s_n, y_b, y_h, y_n,
                     HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ROUND: tl.constexpr):
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
        tl.store(y_ptr + b * y_b + n * y_n + h * y_h + d, y, mask=mask)


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


def rope_triton(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """The one launch: every head of a (batch row, position) per program."""
    require_triton()
    _check(x, cos, signed_sin)
    B, H, N, hd = x.shape
    for name, t in (("x", x), ("cos", cos), ("signed_sin", signed_sin)):
        require(t.stride(-1) == 1, f"rope: {name}'s last dimension must be contiguous")
        require(t.dtype == x.dtype, f"rope_triton: {name} must have x's dtype {x.dtype}, got {t.dtype}")
    y = torch.empty(B, N, H, hd, device=x.device, dtype=x.dtype)
    if y.numel():
        cb = cos.stride(0) if cos.shape[0] == B else 0
        sb = signed_sin.stride(0) if signed_sin.shape[0] == B else 0
        _rope_kernel[(B * N,)](x, cos, signed_sin, y, H, N, x.stride(0), x.stride(1), x.stride(2), cb,
                               cos.stride(1), sb, signed_sin.stride(1), y.stride(0), y.stride(2), y.stride(1),
                               HALF=hd // 2, BLOCK_H=next_pow2(H), BLOCK_D=max(16, next_pow2(hd)),
                               ROUND=x.element_size() == 2,
                               num_warps=4, enable_fp_fusion=False)
    return y.transpose(1, 2)


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, N, hd] by the tables [B, N, hd]: Triton on CUDA, torch elsewhere."""
    if use_triton(x, cos, signed_sin):
        return rope_triton(x, cos, signed_sin)
    return rope_reference(x, cos, signed_sin)
