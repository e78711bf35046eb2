"""The fused state reader equals its torch reference: features and gradients, over shapes and dtypes.

Without CUDA the Triton kernel runs on CPU tensors through Triton's interpreter (small sizes);
with CUDA it is compiled, and the `cuda` tests add the paper's full size.
"""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

# On CPU: Triton's interpreter, switched on before the kernel module imports triton. If another
# module imported triton first, these tests skip here and test_kernels_fresh_process runs them.
RUNNABLE = prepare_interpreter()

sr = importlib.import_module("ready_kernels.state_reader")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(sr.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(L, S, H, dk, dv, layers, B, P, r, state_dtype, device=DEVICE, grad=True):
    ssm = (torch.randn(L, S, H, dk, dv, device=device) * torch.rand(L, S, H, 1, 1, device=device) * 4).to(state_dtype)
    layer_idx = torch.tensor(layers, device=device)
    slots = torch.randperm(S, device=device)[:B]
    M = len(layers) * H
    z = torch.randn(B, P, M, r, device=device, requires_grad=grad)
    U = (torch.randn(M, r, dk, device=device) / dk**0.5).requires_grad_(grad)
    V = (torch.randn(M, dv, r, device=device) / dv**0.5).requires_grad_(grad)
    return ssm, layer_idx, slots, z, U, V


SMALL = [
    # L, S, H, d_k, d_v, layers, B, P, r, state dtype
    (3, 4, 3, 16, 16, [2, 0], 2, 7, 8, torch.float32),
    (3, 4, 3, 32, 32, [1], 3, 7, 16, torch.bfloat16),
    (2, 3, 2, 64, 64, [1, 0], 1, 7, 64, torch.float32),
    (2, 3, 2, 64, 32, [0, 1], 2, 5, 8, torch.bfloat16),
    (2, 2, 3, 16, 24, [1], 2, 3, 8, torch.float32),  # non-power-of-2 d_v
]


@pytest.mark.parametrize("block_k", [16, None], ids=["16-row-blocks", "default-blocks"])
@pytest.mark.parametrize("L,S,H,dk,dv,layers,B,P,r,dtype", SMALL)
def test_features_and_gradients_match_reference(L, S, H, dk, dv, layers, B, P, r, dtype, block_k):
    ssm, layer_idx, slots, z, U, V = make_inputs(L, S, H, dk, dv, layers, B, P, r, dtype)
    got = sr.state_reader_triton(ssm, layer_idx, slots, z, U, V, block_k=block_k)
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    M = len(layers) * H
    assert got.shape == (B, P, M * r + M)
    assert rel_err(got, want) < 1e-4

    grad = torch.randn_like(want)
    got_g = torch.autograd.grad(got, (z, U, V), grad)
    want_g = torch.autograd.grad(want, (z, U, V), grad)
    for name, a, b in zip("zUV", got_g, want_g):
        assert rel_err(a, b) < 1e-4, f"gradient w.r.t. {name}"


@pytest.mark.parametrize("precision", ["ieee", "tf32x2", "tf32x3"])
@pytest.mark.parametrize("L,S,H,dk,dv,layers,B,P,r,dtype", [SMALL[0], SMALL[1], SMALL[4]])
def test_every_product_precision_gives_the_reference_features(L, S, H, dk, dv, layers, B, P, r, dtype, precision):
    """The state product on FMAs or as split tf32 terms (high + low parts add back to the fp32 operands)."""
    ssm, layer_idx, slots, z, U, V = make_inputs(L, S, H, dk, dv, layers, B, P, r, dtype, grad=False)
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    got = sr.state_reader_triton(ssm, layer_idx, slots, z, U, V, precision=precision, block_k=16)
    assert rel_err(got, want) < 1e-4


def test_unknown_precision_is_one_clear_error():
    ssm, layer_idx, slots, z, U, V = make_inputs(2, 3, 2, 16, 16, [1], 2, 3, 8, torch.float32, grad=False)
    with pytest.raises(KernelInputError, match="precision must be one of .*got 'fp64'"):
        sr.state_reader_triton(ssm, layer_idx, slots, z, U, V, precision="fp64")


def test_reference_matches_the_method_written_per_pair():
    """One (b, p, m) computed by hand from the formulas in the module docstring."""
    ssm, layer_idx, slots, z, U, V = make_inputs(3, 4, 2, 16, 16, [2, 1], 2, 3, 4, torch.float32, device="cpu", grad=False)
    feats = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V, eps=1e-6)
    H, M, r = 2, 4, 4
    for b, p, m in [(0, 0, 0), (1, 2, 3), (1, 1, 2)]:
        S = ssm[layer_idx[m // H], slots[b], m % H]
        rms = torch.sqrt(S.pow(2).mean() + 1e-6)
        q = U[m].T @ z[b, p, m]
        T = V[m].T @ (S / rms).T
        u = T @ q / 16**0.5
        torch.testing.assert_close(feats[b, p, m * r:(m + 1) * r], u, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(feats[b, p, M * r + m], torch.log(rms), rtol=1e-5, atol=1e-6)


def test_writes_every_element_of_a_preallocated_buffer_in_place():
    ssm, layer_idx, slots, z, U, V = make_inputs(2, 3, 3, 16, 16, [1, 0], 2, 7, 8, torch.float32, grad=False)
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    out = torch.full((2, 7, 6 * 8 + 6), float("nan"), device=DEVICE)
    ret = sr.state_reader_triton(ssm, layer_idx, slots, z, U, V, out=out)
    assert ret is out
    assert rel_err(out, want) < 1e-4


def test_reads_teacher_states_through_a_strided_view_without_copy():
    B, A, Ls, H, dk, dv, P, r = 2, 3, 2, 2, 16, 16, 4, 8
    states = torch.randn(B, A, Ls, H, dk, dv, device=DEVICE)
    ssm, layer_idx, slots = sr.states_as_cache(states)
    assert ssm.data_ptr() == states.data_ptr()
    z = torch.randn(B * A, P, Ls * H, r, device=DEVICE)
    U = torch.randn(Ls * H, r, dk, device=DEVICE)
    V = torch.randn(Ls * H, dv, r, device=DEVICE)
    got = sr.state_reader_triton(ssm, layer_idx, slots, z, U, V)
    want = sr.state_reader_reference(ssm.contiguous(), layer_idx, slots, z, U, V)
    assert rel_err(got, want) < 1e-4


def test_gradient_flows_into_a_preallocated_buffer_too():
    ssm, layer_idx, slots, z, U, V = make_inputs(2, 3, 2, 16, 16, [1], 2, 3, 8, torch.float32)
    out = torch.empty(2, 3, 2 * 8 + 2, device=DEVICE)
    got = sr.state_reader_triton(ssm, layer_idx, slots, z, U, V, out=out)
    (gz,) = torch.autograd.grad(got.square().sum(), (z,))
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    (wz,) = torch.autograd.grad(want.square().sum(), (z,))
    assert rel_err(gz, wz) < 1e-4


def test_dispatch_uses_the_reference_off_cuda():
    ssm, layer_idx, slots, z, U, V = make_inputs(2, 3, 2, 16, 16, [1], 2, 3, 8, torch.float32, device="cpu", grad=False)
    torch.testing.assert_close(sr.state_reader(ssm, layer_idx, slots, z, U, V),
                               sr.state_reader_reference(ssm, layer_idx, slots, z, U, V), rtol=0, atol=0)


def test_wrong_projection_shape_is_one_clear_error():
    ssm, layer_idx, slots, z, U, V = make_inputs(2, 3, 2, 16, 16, [1], 2, 3, 8, torch.float32, device="cpu", grad=False)
    with pytest.raises(KernelInputError, match=r"U must be \[M=2, r=8, d_k=16\]"):
        sr.state_reader(ssm, layer_idx, slots, z, U[:, :4], V)
    with pytest.raises(KernelInputError, match="z must be"):
        sr.state_reader(ssm, layer_idx, slots, z[:1], U, V)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("r,B", [(8, 1), (8, 4), (64, 2)])
def test_paper_size_on_cuda(dtype, r, B):
    """2 source layers x 48 value heads, d_k = d_v = 128, block of 7, read from a 6-layer cache."""
    ssm, layer_idx, slots, z, U, V = make_inputs(6, 4, 48, 128, 128, [4, 1], B, 7, r, dtype, device="cuda")
    got = sr.state_reader(ssm, layer_idx, slots, z, U, V)
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    assert rel_err(got, want) < 1e-4
    # fp32-accurate products: FMAs, three tf32 terms, and two terms where the states are 16-bit
    # (plain tf32 rounds U to 10 mantissa bits, ~1e-3, so it is left out)
    exact = ["ieee", "tf32x3"] + (["tf32x2"] if dtype == torch.bfloat16 else [])
    for precision in exact:
        got_p = sr.state_reader_triton(ssm, layer_idx, slots, z.detach(), U.detach(), V.detach(), precision=precision)
        assert rel_err(got_p, want) < 1e-5, precision
    grad = torch.randn_like(want)
    for name, a, b in zip("zUV", torch.autograd.grad(got, (z, U, V), grad), torch.autograd.grad(want, (z, U, V), grad)):
        assert rel_err(a, b) < 1e-4, f"gradient w.r.t. {name}"


def test_stage_benchmark_kernel_run_to_the_end_is_the_reader():
    """benchmarks/kernel_stages.py times the reader cut after each stage; uncut, it must be the reader."""
    stages = importlib.import_module("benchmarks.kernel_stages")
    H, d, r, P, M = 2, 16, 8, 3, 4
    ssm, layer_idx, slots, z, U, V = make_inputs(3, 2, H, d, d, [2, 0], 1, P, r, torch.float32, grad=False)
    out = torch.zeros(1, P, M * r + M, device=DEVICE)
    stages._reader_stage_kernel[(M,)](ssm, layer_idx, slots, z, U, V, out, *ssm.stride()[:3], *z.stride()[:3], H, M,
                                      P, r, d, d, 1e-6, d**-0.5, BP=16, BR=16, BK=d, BV=d, TERMS=3,
                                      STAGE=stages.STAGES["full"])
    want = sr.state_reader_reference(ssm, layer_idx, slots, z, U, V)
    assert rel_err(out[..., : M * r], want[..., : M * r]) < 1e-5
