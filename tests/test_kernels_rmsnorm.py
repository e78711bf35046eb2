"""The Triton RMSNorm equals the torch reference; training goes through the differentiable reference.

On CPU the kernel runs through Triton's interpreter; with CUDA it is compiled.
"""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter  # noqa: E402

# On CPU: Triton's interpreter, switched on before the kernel module imports triton. If another
# module imported triton first, these tests skip here and test_kernels_fresh_process runs them.
RUNNABLE = prepare_interpreter()

rn = importlib.import_module("ready_kernels.rmsnorm")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(rn.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 64), (4, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [1.0, 0.0])
def test_matches_reference(shape, dtype, offset):
    x = (torch.randn(shape, device=DEVICE) * 3).to(dtype)
    w = (torch.randn(shape[-1], device=DEVICE) * 0.1).to(dtype)
    got = rn.rms_norm_triton(x, w, 1e-6, offset)
    want = rn.rms_norm_reference(x, w, 1e-6, offset)
    assert got.dtype == dtype and got.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def qwen3_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Qwen3's RMSNorm (DSpark's draft layers'): weight * (x / rms(x)).to(dtype), two roundings."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_cast_first_is_qwen3s_norm(dtype, offset):
    x = (torch.randn(5, 96, device=DEVICE) * 3).to(dtype)
    w = (torch.randn(96, device=DEVICE) * 0.1 + (1 - offset)).to(dtype)
    want = qwen3_norm(x, offset + w)
    assert torch.equal(rn.rms_norm_reference(x, w, 1e-6, offset, cast_first=True), want)
    got = rn.rms_norm_triton(x, w, 1e-6, offset, cast_first=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # the row sums in another order (the interpreter truncates bf16)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    with pytest.raises(KernelInputError, match="cast_first scales in x's dtype"):
        rn.rms_norm(x, w.float() if dtype == torch.bfloat16 else w.bfloat16(), cast_first=True)


@pytest.mark.cuda
def test_cast_first_rounds_twice_as_qwen3_does_on_cuda():
    x = torch.randn(64, 5120, device="cuda", dtype=torch.bfloat16) * 3
    w = (1 + torch.randn(5120, device="cuda") * 0.1).bfloat16()
    want = qwen3_norm(x, w)
    same = (rn.rms_norm_triton(x, w, 1e-6, 0.0, cast_first=True) == want).float().mean().item()
    once = (rn.rms_norm_triton(x, w, 1e-6, 0.0) == want).float().mean().item()
    assert same > 0.995 and once < same  # only the row sum's order differs; one rounding differs more


def test_reference_is_the_qwen_formula():
    x, w = torch.randn(2, 6), torch.randn(6)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + w)
    torch.testing.assert_close(rn.rms_norm_reference(x, w, 1e-5, 1.0), want)


def test_non_contiguous_rows():
    x = torch.randn(8, 32, device=DEVICE)[::2]
    w = torch.randn(32, device=DEVICE)
    torch.testing.assert_close(rn.rms_norm_triton(x, w), rn.rms_norm_reference(x, w), rtol=1e-5, atol=1e-5)


def test_dispatch_keeps_gradients():
    x = torch.randn(3, 16, device=DEVICE, requires_grad=True)
    w = torch.randn(16, device=DEVICE, requires_grad=True)
    y = rn.rms_norm(x, w)
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    assert torch.isfinite(gx).all() and gw.abs().sum() > 0


def test_wrong_weight_is_one_clear_error():
    with pytest.raises(KernelInputError, match=r"weight must be \[8\]"):
        rn.rms_norm(torch.randn(2, 8), torch.randn(7))


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 8, 300])
def test_hidden_5120_on_cuda(rows):
    x = torch.randn(rows, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5120, device="cuda", dtype=torch.bfloat16) * 0.1
    torch.testing.assert_close(rn.rms_norm(x, w), rn.rms_norm_reference(x, w), rtol=1e-2, atol=1e-2)
