"""row_norm (the target's exact mode): the Triton kernel matches the torch reference over shapes and
dtypes, and both give a row the same bits whatever the number of rows (interpreter on CPU, compiled on
CUDA)."""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

RUNNABLE = prepare_interpreter()

rn = importlib.import_module("ready_kernels.row_norm")

pytestmark = kernel_test_marks(rn.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rows_invariant(fn, x):
    single = [fn(x[i:i + 1]) for i in range(x.shape[0])]
    return all(torch.equal(fn(x[:m])[i:i + 1], single[i]) for m in (1, 2, 5, x.shape[0]) for i in range(m))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,weighted,mean,offset", [(64, True, True, 1.0), (200, False, True, 0.0),
                                                     (128, False, False, 0.0), (37, True, True, 0.0)])
def test_triton_matches_reference_and_rows_are_invariant(d, weighted, mean, offset, dtype):
    x = torch.randn(8, d, device=DEVICE).to(dtype)
    w = torch.randn(d, device=DEVICE) if weighted else None
    got = rn.row_norm_triton(x, w, 1e-6, offset, mean)
    want = rn.row_norm_reference(x, w, 1e-6, offset, mean)
    assert got.dtype == dtype and got.shape == x.shape
    assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert rows_invariant(lambda a: rn.row_norm_triton(a, w, 1e-6, offset, mean), x)
    assert rows_invariant(lambda a: rn.row_norm_reference(a, w, 1e-6, offset, mean), x)


def test_out_dtype_and_leading_dims():
    x = torch.randn(2, 3, 4, 32, device=DEVICE).to(torch.bfloat16)
    y = rn.row_norm_triton(x, None, 1e-6, 0.0, False, torch.float32)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.allclose(y.norm(dim=-1), torch.ones(2, 3, 4, device=DEVICE), atol=1e-3)


def test_dispatch_and_custom_op_give_the_reference_off_cuda():
    x = torch.randn(3, 48)
    y = rn.row_norm(x, torch.ones(48), 1e-6, 0.0)
    assert torch.equal(y, rn.row_norm_reference(x, torch.ones(48), 1e-6, 0.0))
    torch.library.opcheck(torch.ops.ready_kernels.row_norm, (x.t().contiguous().t(), None, 1e-6, 0.0, True,
                                                             torch.float32))


def test_bad_weight_is_one_clear_error():
    with pytest.raises(rn.KernelInputError if hasattr(rn, "KernelInputError") else ValueError, match="weight must be"):
        rn.row_norm_reference(torch.randn(2, 8), torch.randn(7))
