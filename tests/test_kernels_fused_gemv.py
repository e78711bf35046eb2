"""fused_gemv (the AR step's projections with the RMSNorm before them and the residual add after
them folded in): the Triton kernel matches the eager RMSNorm, F.linear and residual add, with and
without each part, over launch shapes that cut K and N unevenly; bad input gets one clear message
(interpreter on CPU at small sizes; compiled on CUDA, where the `cuda` tests add the 27B shapes)."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err

RUNNABLE = prepare_interpreter()

fg = importlib.import_module("ready_kernels.fused_gemv")
from ready_kernels._common import KernelInputError  # noqa: E402
from ready_kernels.small_m_gemm import Config  # noqa: E402

pytestmark = kernel_test_marks(fg.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(N, K, dtype, norm, residual, device=DEVICE, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    x = r(1, 1, K).to(dtype)
    nw = (0.3 * r(K)).to(dtype) if norm else None
    res = r(1, 1, N).to(dtype) if residual else None
    return x, nw, res, (r(N, K) / K**0.5).to(dtype)


def eager(x, nw, res, w, eps=1e-6):
    """What ready/target/layers.py computes without the fusion: RMSNorm module, linear, `x + h`."""
    h = x
    if nw is not None:
        xf = x.float()
        h = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * (1.0 + nw.float())).to(x.dtype)
    out = F.linear(h, w)
    return out if res is None else res + out


@pytest.mark.parametrize("norm, residual", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_eager_norm_linear_and_residual(norm, residual, dtype):
    N, K = 37, 96  # N not a multiple of any BN; K three BK=32 steps, or one and a half BK=64 steps
    x, nw, res, w = inputs(N, K, dtype, norm, residual)
    want = eager(x, nw, res, w).reshape(-1)
    # bf16: Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding to nearest (the
    # compiled kernel rounds: the cuda test holds it to 1e-2)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for cfg in (Config(2, 32, 1, 4, 3, gemv=True), Config(4, 64, 1, 2, 3, gemv=True)):
        got = fg.fused_gemv_triton(x, w, nw, res, config=cfg)
        assert got.shape == (N,) and got.dtype == dtype
        assert rel_err(got, want) < tol, cfg.name()
    assert rel_err(fg.fused_gemv_reference(x, w, nw, res), want) < 1e-6


def test_the_norm_scale_comes_from_the_whole_row_not_one_tile():
    """Each program sums x^2 over every K step: a row whose energy sits in its last tile is scaled
    by the row's rms (a per-tile rms would scale the first tiles wrongly)."""
    x, nw, _, w = inputs(8, 128, torch.float32, True, False)
    x[..., -32:] *= 50.0
    got = fg.fused_gemv_triton(x, w, nw, config=Config(2, 32, 1, 4, 3, gemv=True))
    assert rel_err(got, eager(x, nw, None, w).reshape(-1)) < 1e-5


def test_the_dispatch_runs_the_reference_off_cuda_and_shapes_like_the_residual():
    x, nw, res, w = inputs(24, 32, torch.float32, True, True, device="cpu")
    got = fg.fused_gemv(x.reshape(2, 16), w, nw, res)  # a row given as heads, e.g. an attention output
    assert got.shape == (1, 1, 24)
    assert rel_err(got, eager(x, nw, res, w)) < 1e-6
    assert fg.fused_gemv(x, w).shape == (1, 1, 24)


@pytest.mark.parametrize("bad, message", [
    (dict(x=torch.randn(2, 32)), "one row of K=32"),
    (dict(x=torch.randn(1, 32, dtype=torch.bfloat16)), "x is torch.bfloat16 but weight is torch.float32"),
    (dict(norm_weight=torch.randn(16)), "norm_weight must hold K=32"),
    (dict(residual=torch.randn(5)), "residual must be one row of N=24"),
    (dict(weight=torch.randn(24, 32, 1)), r"weight must be \[N, K\]"),
])
def test_bad_input_names_what_was_expected(bad, message):
    x, nw, res, w = inputs(24, 32, torch.float32, True, True, device="cpu")
    args = dict(x=x, weight=w, norm_weight=nw, residual=res)
    args.update(bad)
    with pytest.raises(KernelInputError, match=message):
        fg.fused_gemv_reference(**args)


def test_the_tuner_keeps_the_fastest_correct_configuration_per_shape():
    times = iter([9.0, 3.0, 1.0, 1.0, 3.0])  # warm-up, then two rounds: (c0, c1), then reversed (c1, c0)
    configs = (Config(2, 32, 1, 4, 3, gemv=True), Config(4, 32, 1, 4, 3, gemv=True))
    tuner = fg.FusedTuner(configs, timer=lambda fn: next(times))
    x, nw, _, w = inputs(16, 64, torch.float32, True, False)
    cfg = tuner.config(x, w, nw, None, 1e-6)
    assert cfg == configs[1] and tuner.config(x, w, nw, None, 1e-6) is cfg  # timed once
    assert [(r["norm"], r["residual"], r["choice"]) for r in tuner.report()] == [(True, False, configs[1].name())]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N, K, norm, residual", [
    (34816, 5120, True, False), (14336, 5120, True, False), (5120, 17408, False, True), (5120, 6144, False, True)])
def test_27b_shapes_on_cuda_match_the_eager_ops_under_the_tuner_and_compile(N, K, norm, residual):
    x, nw, res, w = inputs(N, K, torch.bfloat16, norm, residual)
    want = eager(x, nw, res, w)
    got = fg.fused_gemv(x, w, nw, res)
    got_c = torch.compile(fg.fused_gemv, fullgraph=True)(x, w, nw, res)
    assert rel_err(got, want) < 1e-2 and rel_err(got_c, want) < 1e-2
