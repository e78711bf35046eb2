"""Add two logit rows in float32 and take the argmax: the Markov head's greedy draft, one position at a time.

    out = float32(a) + float32(b)          (a, b: [R, V] in any float dtype; out: [R, V] float32)
    idx = out.argmax(-1)                   (int64 [R]; the first maximal index, a NaN before any number)

In the greedy draft, position j's logits are the LM head's bf16 logits plus the Markov head's bf16 bias,
summed in float32, and its token is their argmax, which the bias of position j + 1 needs. In torch that
is a conversion of the logits to float32, the add and the argmax: three passes over B x V floats a
position, a large share of the batched draft step (docs/kernels.md). Here one pass reads
the two bf16 rows, writes the float32 sums and reduces them; a second, small launch combines each row's
partial maxima. The sums are the same floats (bf16 to float32 is exact, one IEEE add), and the index
follows torch.argmax: the first maximal index, and the first NaN where a row has one.

- `add_argmax_reference`: plain torch (`torch.add` into `out`, then `argmax`).
- `add_argmax_triton`: the two launches above (no autograd).
- `add_argmax`: dispatch, Triton on CUDA, the reference elsewhere.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require, require_triton, use_triton

BLOCK = 1024  # columns a program sums per iteration
PROGRAMS = 1024  # programs the first launch aims at over all rows (a row of 248k columns is 243 blocks)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _add_argmax_partial(a_ptr, b_ptr, out_ptr, val_ptr, idx_ptr, nan_ptr, V, a_row, b_row, out_row,
                            span, S, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        cols0 = tl.arange(0, BLOCK)
        big = tl.full([], 0, tl.int32) + V  # no column: loses every min
        best = tl.full([], float("-inf"), tl.float32)
        best_i = big
        first_nan = big
        for start in range(part * span, tl.minimum(part * span + span, V), BLOCK):
            cols = start + cols0
            mask = cols < V
            x = (tl.load(a_ptr + row * a_row + cols, mask=mask, other=0.0).to(tl.float32)
                 + tl.load(b_ptr + row * b_row + cols, mask=mask, other=0.0).to(tl.float32))
            tl.store(out_ptr + row * out_row + cols, x, mask=mask)
            nan = (x != x) & mask
            first_nan = tl.minimum(first_nan, tl.min(tl.where(nan, cols, big), 0))
            x = tl.where(mask & ~nan, x, float("-inf"))
            m = tl.max(x, 0)
            m_i = tl.min(tl.where(mask & (x == m), cols, big), 0)
            take = (m > best) | ((m == best) & (m_i < best_i))  # blocks ascend: equal keeps the first
            best_i = tl.where(take, m_i, best_i)
            best = tl.where(take, m, best)
        tl.store(val_ptr + row * S + part, best)
        tl.store(idx_ptr + row * S + part, best_i)
        tl.store(nan_ptr + row * S + part, first_nan)

    @triton.jit
    def _add_argmax_final(val_ptr, idx_ptr, nan_ptr, res_ptr, V, S, BLOCK_S: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        parts = tl.arange(0, BLOCK_S)
        mask = parts < S
        val = tl.load(val_ptr + row * S + parts, mask=mask, other=float("-inf"))
        idx = tl.load(idx_ptr + row * S + parts, mask=mask, other=V)
        first_nan = tl.min(tl.load(nan_ptr + row * S + parts, mask=mask, other=V), 0)
        m = tl.max(val, 0)
        m_i = tl.min(tl.where(val == m, idx, V), 0)
        tl.store(res_ptr + row, tl.where(first_nan < V, first_nan, m_i).to(tl.int64))


def _check(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    require(a.dim() == 2 and a.shape[1] > 0, f"add_argmax: a must be [rows, V] with V > 0, got {tuple(a.shape)}")
    require(b.shape == a.shape and out.shape == a.shape,
            f"add_argmax: a, b and out must have one shape, got {tuple(a.shape)}, {tuple(b.shape)}, {tuple(out.shape)}")
    require(out.dtype == torch.float32, f"add_argmax: out must be float32, got {out.dtype}")
    require(a.is_floating_point() and b.is_floating_point(),
            f"add_argmax: a and b must be floating point, got {a.dtype} and {b.dtype}")
    require(a.device == b.device == out.device, f"add_argmax: a, b, out on {a.device}, {b.device}, {out.device}")


def add_argmax_reference(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Plain torch: out = float32(a) + b, then out's argmax per row (int64 [rows])."""
    _check(a, b, out)
    torch.add(a.float(), b, out=out)  # float32(a) first: torch.add(bf16, bf16, out=fp32) rounds to bf16
    return out.argmax(-1)


def add_argmax_triton(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The Triton path: one pass writes out and each span's best, a second combines them per row."""
    require_triton()
    _check(a, b, out)
    for name, t in (("a", a), ("b", b), ("out", out)):
        require(t.stride(-1) == 1, f"add_argmax: {name}'s last dimension must be contiguous")
    R, V = a.shape
    res = torch.empty(R, dtype=torch.int64, device=a.device)
    if R == 0:
        return res
    blocks = -(-V // BLOCK)
    S = min(blocks, max(1, -(-PROGRAMS // R)))
    span = -(-blocks // S) * BLOCK
    S = -(-V // span)  # no program without columns
    val = torch.empty(R, S, dtype=torch.float32, device=a.device)
    idx = torch.empty(R, S, dtype=torch.int32, device=a.device)
    nan = torch.empty(R, S, dtype=torch.int32, device=a.device)
    _add_argmax_partial[(R, S)](a, b, out, val, idx, nan, V, a.stride(0), b.stride(0), out.stride(0), span, S,
                                BLOCK=BLOCK, num_warps=4)
    _add_argmax_final[(R,)](val, idx, nan, res, V, S, BLOCK_S=max(16, next_pow2(S)), num_warps=1)
    return res


def add_argmax(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """float32(a) + float32(b) into `out` and its argmax per row: Triton on CUDA, torch elsewhere."""
    if use_triton(a, b, out):
        return add_argmax_triton(a, b, out)
    return add_argmax_reference(a, b, out)
