"""The fused per-head norm and rotary equals its torch reference, and the reference is the drafter's ops.

On CPU the kernel runs through Triton's interpreter; with CUDA it is compiled.
"""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter  # noqa: E402

RUNNABLE = prepare_interpreter()

nr = importlib.import_module("ready_kernels.norm_rope")
rn = importlib.import_module("ready_kernels.rmsnorm")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(nr.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tables(B: int, N: int, D: int, dtype: torch.dtype, device: str = DEVICE, factor: float = 1.0):
    """cos, sin [B, N, D] of positions 5.. as the drafter's Rotary makes them (theta 1e6)."""
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = (torch.arange(5, 5 + N, dtype=torch.float32)[:, None] * inv).repeat(1, 2)
    ang = ang.expand(B, N, D)
    return (ang.cos() * factor).to(dtype).to(device), (ang.sin() * factor).to(dtype).to(device)


def drafter_ops(x, w, cos, sin):
    """What a draft layer does without the kernel: its RMSNorm, the transpose, its apply_rope."""
    from ready.drafter.layers import RMSNorm, apply_rope

    norm = RMSNorm(x.shape[-1]).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    return apply_rope(norm(x).transpose(1, 2), cos, sin).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_draft_layers_norm_then_rotary(dtype):
    x = (torch.randn(2, 3, 4, 32) * 3).to(dtype)
    w = (1 + torch.randn(32) * 0.1).to(dtype)
    cos, sin = tables(2, 3, 32, dtype, "cpu", factor=1.2)
    with torch.no_grad():
        assert torch.equal(nr.norm_rope_reference(x, w, cos, sin), drafter_ops(x, w, cos, sin))


@pytest.mark.parametrize("shape", [(1, 8, 4, 32), (2, 3, 2, 64), (3, 1, 5, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(shape, dtype):
    B, N, H, D = shape
    x = (torch.randn(shape, device=DEVICE) * 3).to(dtype)
    w = (1 + torch.randn(D, device=DEVICE) * 0.1).to(dtype)
    cos, sin = tables(B, N, D, dtype)
    got = nr.norm_rope_triton(x, w, cos, sin)
    want = nr.norm_rope_reference(x, w, cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # the row sums in another order (the interpreter truncates bf16)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_one_table_row_serves_every_batch_row_and_strided_inputs():
    x = torch.randn(3, 4, 6, 32, device=DEVICE)[:, :, ::2]  # heads strided
    w = torch.randn(32, device=DEVICE)
    cos, sin = tables(1, 4, 32, torch.float32)
    got = nr.norm_rope_triton(x, w, cos, sin)
    torch.testing.assert_close(got, nr.norm_rope_reference(x, w, cos.expand(3, -1, -1), sin.expand(3, -1, -1)),
                               rtol=1e-5, atol=1e-5)


def test_dispatch_keeps_gradients():
    x = torch.randn(1, 2, 2, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    cos, sin = tables(1, 2, 16, torch.float32)
    gx, gw = torch.autograd.grad(nr.norm_rope(x, w, cos, sin).sum(), (x, w))
    assert torch.isfinite(gx).all() and gw.abs().sum() > 0


def test_bad_inputs_are_one_clear_error():
    x = torch.randn(1, 2, 2, 16)
    cos, sin = tables(1, 2, 16, torch.float32, "cpu")
    with pytest.raises(KernelInputError, match=r"weight must be \[16\]"):
        nr.norm_rope(x, torch.randn(15), cos, sin)
    with pytest.raises(KernelInputError, match=r"cos must be \[1 or 1, 2, 16\]"):
        nr.norm_rope(x, torch.randn(16), cos[:, :1], sin)
    with pytest.raises(KernelInputError, match="head_dim must be even"):
        nr.norm_rope(torch.randn(1, 2, 2, 15), torch.randn(15), cos[..., :15], sin[..., :15])
    with pytest.raises(KernelInputError, match="sin must be torch.float32"):
        nr.norm_rope(x, torch.randn(16), cos, sin.bfloat16())


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 8, 32, 128), (32, 8, 8, 128)])
def test_rounds_as_the_triton_norm_then_the_torch_rotary_on_cuda(shape):
    """On the GPU the kernel's bits are the Triton norm's followed by the drafter's torch rotary."""
    from ready.drafter.layers import apply_rope

    B, N, H, D = shape
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    w = (1 + torch.randn(D, device="cuda") * 0.1).bfloat16()
    cos, sin = tables(B, N, D, torch.bfloat16, "cuda", factor=1.1)
    normed = rn.rms_norm_triton(x, w, 1e-6, 0.0, cast_first=True)
    want = apply_rope(normed.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.equal(nr.norm_rope_triton(x, w, cos, sin), want)
