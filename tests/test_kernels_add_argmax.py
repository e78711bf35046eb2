"""add_argmax (the Markov head's greedy draft): the Triton kernel gives torch's sums and torch's argmax,
ties, infinities and NaNs included, over row counts, vocabulary sizes and strided rows (interpreter on
CPU, compiled on CUDA)."""

import importlib

import pytest
import torch

from ready_kernels._common import KernelInputError
from ready_kernels._testing import kernel_test_marks, prepare_interpreter

RUNNABLE = prepare_interpreter()

aa = importlib.import_module("ready_kernels.add_argmax")

pytestmark = kernel_test_marks(aa.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def both(a, b):
    """(sums, indices) of the Triton kernel and of the reference, each into its own float32 buffer."""
    got_out, want_out = (torch.full(a.shape, 7.0, device=a.device) for _ in range(2))
    got = aa.add_argmax_triton(a, b, got_out)
    want = aa.add_argmax_reference(a, b, want_out)
    return got, want, got_out, want_out


@pytest.mark.parametrize("rows,vocab", [(1, 3000), (3, 1024), (5, 2049), (40, 777), (2, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sums_and_argmax_are_torchs(rows, vocab, dtype):
    torch.manual_seed(rows * vocab)
    a = torch.randn(rows, vocab, device=DEVICE).to(dtype)
    b = torch.randn(rows, vocab, device=DEVICE).to(dtype)
    got, want, got_out, want_out = both(a, b)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert torch.equal(got_out, want_out)  # the same float32 sums, bit for bit


def test_ties_go_to_the_first_index_across_programs():
    """Maxima equal in value in several spans (and inside one block): the first column wins, as in torch."""
    V = 5000
    a = torch.zeros(4, V, device=DEVICE, dtype=torch.bfloat16)
    b = torch.zeros(4, V, device=DEVICE, dtype=torch.bfloat16)
    a[0, [4000, 1500, 1501]] = 3.0  # row 0: ties in two blocks
    a[1, [4999, 3]] = 2.0
    b[1, 3] = -1.0  # row 1: the sum breaks the tie (3 is 1.0)
    a[2] = float("-inf")  # row 2: every sum -inf: column 0
    a[3, 2500] = float("inf")
    a[3, 100] = float("inf")  # row 3: +inf twice
    got, want, _, _ = both(a, b)
    assert got.tolist() == want.tolist() == [1500, 4999, 0, 100]


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the interpreter's numpy on inf - inf
def test_a_nan_wins_as_in_torch():
    V = 3000
    a = torch.randn(3, V, device=DEVICE, dtype=torch.bfloat16)
    b = torch.zeros(3, V, device=DEVICE, dtype=torch.bfloat16)
    a[0, 2999] = float("nan")
    a[0, 5] = float("inf")
    b[1, [2000, 1200]] = float("nan")
    a[2, 7] = float("inf")
    b[2, 7] = float("-inf")  # inf + -inf = NaN in float32
    got, want, got_out, want_out = both(a, b)
    assert got.tolist() == want.tolist() == [2999, 1200, 7]
    assert torch.equal(got_out.isnan(), want_out.isnan())


def test_strided_rows_of_a_draft_block_and_their_out_slices():
    """The head passes logits[:, j] of [B, K, V] tensors: rows strided by K x V."""
    base = torch.randn(4, 3, 1500, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(4, 1500, device=DEVICE).to(torch.bfloat16)
    out = torch.zeros(4, 3, 1500, device=DEVICE)
    want_out = torch.zeros(4, 3, 1500, device=DEVICE)
    got = aa.add_argmax_triton(base[:, 1], bias, out[:, 1])
    want = aa.add_argmax_reference(base[:, 1], bias, want_out[:, 1])
    assert torch.equal(got, want) and torch.equal(out, want_out)  # positions 0 and 2 untouched


def test_dispatch_gives_the_reference_off_cuda_and_bad_input_is_one_clear_error():
    a, b = torch.randn(2, 10), torch.randn(2, 10)
    out = torch.empty(2, 10)
    assert torch.equal(aa.add_argmax(a, b, out), (a + b).argmax(-1))
    with pytest.raises(KernelInputError, match="out must be float32"):
        aa.add_argmax(a, b, torch.empty(2, 10, dtype=torch.bfloat16))
    with pytest.raises(KernelInputError, match="one shape"):
        aa.add_argmax(a, b[:, :9], out)


@pytest.mark.cuda
@pytest.mark.parametrize("rows", [1, 32])
def test_the_draft_steps_shapes_on_cuda(rows):
    """The public-DSpark drafter's greedy step: logits[:, j] of [B, 7, 248,320] plus a bf16 bias, with
    bf16's coarse grid making exact ties between columns common."""
    base = (torch.randn(rows, 7, 248_320, device="cuda") * 4).bfloat16()
    bias = (torch.randn(rows, 248_320, device="cuda") * 4).bfloat16()
    for j in (0, 6):
        out, want_out = torch.empty(rows, 248_320, device="cuda"), torch.empty(rows, 248_320, device="cuda")
        got = aa.add_argmax(base[:, j], bias, out)
        want = aa.add_argmax_reference(base[:, j], bias, want_out)
        assert torch.equal(got, want) and torch.equal(out, want_out)
