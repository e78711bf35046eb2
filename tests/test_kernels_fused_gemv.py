"""fused_gemv (the AR step's projections with the op before them and the residual add folded in):
the Triton kernel matches the eager layer ops followed by F.linear for every prologue, with and
without a residual, over launch shapes that cut K and N unevenly; bad input gets one clear message
(interpreter on CPU at small sizes; compiled on CUDA, where the `cuda` tests add the 27B shapes)."""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err

RUNNABLE = prepare_interpreter()

fg = importlib.import_module("ready_kernels.fused_gemv")
from ready_kernels._common import KernelInputError  # noqa: E402
from ready_kernels.small_m_gemm import Config  # noqa: E402

pytestmark = kernel_test_marks(fg.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEAD = 16


def inputs(kind, N, K, dtype, residual, device=DEVICE, seed=0):
    """x (fp32 for the gated norm: the GDN kernel's output), z, norm weight, residual, weight."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    x = r(1, 1, K) if kind == fg.GATED else r(1, 1, K).to(dtype)
    z = r(1, 1, K).to(dtype) if kind in (fg.SWIGLU, fg.GATED, fg.SIGMOID) else None
    nw = (0.1 * r(HEAD if kind == fg.GATED else K)).to(dtype) if kind in (fg.RMSNORM, fg.GATED) else None
    res = r(1, 1, N).to(dtype) if residual else None
    w = (r(N, K) / K**0.5).to(dtype)
    return x, z, nw, res, w


def eager_layer_ops(kind, x, z, nw, res, w, eps=1e-6):
    """What ready/target/layers.py computes without the fusion (the ops as the eager layers write them)."""
    import torch.nn.functional as F

    dtype = w.dtype
    if kind == fg.PLAIN:
        h = x
    elif kind == fg.RMSNORM:
        xf = x.float()
        h = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * (1.0 + nw.float())).to(dtype)
    elif kind == fg.SWIGLU:
        h = F.silu(x) * z
    elif kind == fg.SIGMOID:
        h = x * torch.sigmoid(z)
    else:
        xh = x.to(dtype).reshape(1, 1, -1, HEAD).float()
        y = (xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
        h = (nw * y * F.silu(z.reshape(1, 1, -1, HEAD).float())).to(dtype).reshape(1, 1, -1)
    out = F.linear(h, w)
    return out if res is None else res + out


KIND_NAMES = ["plain", "rmsnorm", "swiglu", "gated", "sigmoid"]


@pytest.mark.parametrize("kind", KIND_NAMES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_eager_layer_ops(kind, residual, dtype):
    k = fg.KINDS[kind]
    N, K = 37, 96  # N not a multiple of any BN, K three BK=32 steps
    x, z, nw, res, w = inputs(k, N, K, dtype, residual)
    want = eager_layer_ops(k, x, z, nw, res, w)
    # 16-bit: the eager path rounds after each op and so does the kernel, but Triton's CPU interpreter
    # truncates fp32 -> bf16 instead of rounding to nearest (the compiled kernel rounds: the cuda test)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for cfg in (Config(2, 32, 1, 4, 3, gemv=True), Config(4, 64, 1, 2, 3, gemv=True)):  # even and ragged K
        got = fg.fused_gemv_triton(x, w, kind, z, nw, res, head=HEAD, config=cfg)
        assert got.shape == (N,) and got.dtype == dtype
        assert rel_err(got, want.reshape(-1)) < tol, cfg.name()
    ref = fg.fused_gemv_reference(x, w, kind, z, nw, res, head=HEAD)
    assert rel_err(ref, want.reshape(-1)) < 1e-6


def test_the_rmsnorm_scale_comes_from_the_whole_row_not_one_tile():
    """Each program sums x^2 over every K step: a row whose energy sits in its last tile is scaled
    by the row's rms (a per-tile rms would scale the first tiles wrongly)."""
    N, K = 8, 128
    x, _, nw, _, w = inputs(fg.RMSNORM, N, K, torch.float32, False)
    x[..., -32:] *= 50.0
    want = eager_layer_ops(fg.RMSNORM, x, None, nw, None, w)
    got = fg.fused_gemv_triton(x, w, "rmsnorm", norm_weight=nw, config=Config(2, 32, 1, 4, 3, gemv=True))
    assert rel_err(got, want.reshape(-1)) < 1e-5


def test_the_gated_norm_normalises_each_head_on_its_own():
    """Heads of very different scale inside one K tile keep their own rms."""
    N, K = 8, 64
    x, z, nw, _, w = inputs(fg.GATED, N, K, torch.float32, False)
    x[..., :HEAD] *= 1e3
    want = eager_layer_ops(fg.GATED, x, z, nw, None, w)
    got = fg.fused_gemv_triton(x, w, "gated", z, nw, head=HEAD, config=Config(2, 64, 1, 4, 3, gemv=True))
    assert rel_err(got, want.reshape(-1)) < 1e-5


def test_the_dispatch_runs_the_reference_off_cuda_and_keeps_the_row_shape():
    x, z, nw, res, w = inputs(fg.SWIGLU, 24, 32, torch.float32, True, device="cpu")
    got = fg.fused_gemv(x, w, "swiglu", z, residual=res)
    assert got.shape == (1, 1, 24)
    assert rel_err(got, eager_layer_ops(fg.SWIGLU, x, z, nw, res, w)) < 1e-6


@pytest.mark.parametrize("bad, message", [
    (lambda x, z, nw, r, w: dict(x=torch.randn(2, 32)), "one row of K=32"),
    (lambda x, z, nw, r, w: dict(z=None), "needs z"),
    (lambda x, z, nw, r, w: dict(norm_weight=torch.randn(32)), "norm_weight with 16 values"),
    (lambda x, z, nw, r, w: dict(residual=torch.randn(5)), "residual must be one row of N=24"),
    (lambda x, z, nw, r, w: dict(head=12), "power-of-two head size"),
    (lambda x, z, nw, r, w: dict(kind="layernorm"), "kind must be one of"),
])
def test_bad_input_names_what_was_expected(bad, message):
    x, z, nw, res, w = inputs(fg.GATED, 24, 32, torch.float32, True, device="cpu")
    args = dict(x=x, weight=w, kind="gated", z=z, norm_weight=nw, residual=res, head=HEAD)
    args.update(bad(x, z, nw, res, w))
    with pytest.raises(KernelInputError, match=message):
        fg.fused_gemv_reference(**args)


def test_a_configuration_that_splits_heads_is_refused():
    x, z, _, _, w = inputs(fg.GATED, 8, 64, torch.float32, False)
    with pytest.raises(KernelInputError, match="splits heads"):
        fg.fused_gemv_triton(x, w, "gated", z, torch.ones(64, device=DEVICE), head=64, config=Config(2, 32, 1, 4, 3, gemv=True))


def test_the_tuner_keeps_the_fastest_correct_configuration_per_shape():
    calls = []

    def timer(fn):  # a fake clock: the second configuration is the fastest
        calls.append(fn)
        return {0: 3.0, 1: 1.0}.get(len(calls) % 2, 2.0)

    configs = (Config(2, 32, 1, 4, 3, gemv=True), Config(4, 32, 1, 4, 3, gemv=True))
    tuner = fg.FusedTuner(configs, timer=timer)
    x, _, nw, _, w = inputs(fg.RMSNORM, 16, 64, torch.float32, False)
    cfg = tuner.config(x, w, fg.RMSNORM, None, nw, None, 1e-6, 0)
    assert cfg in configs and tuner.config(x, w, fg.RMSNORM, None, nw, None, 1e-6, 0) is cfg
    assert [r["kind"] for r in tuner.report()] == ["rmsnorm"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind, N, K", [
    ("rmsnorm", 16480, 5120), ("rmsnorm", 34816, 5120), ("swiglu", 5120, 17408), ("gated", 5120, 6144),
    ("sigmoid", 5120, 6144), ("plain", 5120, 6144)])
def test_27b_shapes_on_cuda_match_the_eager_ops_under_the_tuner_and_compile(kind, N, K):
    global HEAD
    k = fg.KINDS[kind]
    prev, HEAD = HEAD, 128
    try:
        x, z, nw, res, w = inputs(k, N, K, torch.bfloat16, residual=kind in ("swiglu", "gated", "sigmoid"))
        want = eager_layer_ops(k, x, z, nw, res, w)
        got = fg.fused_gemv(x, w, kind, z, nw, res, head=HEAD)
        compiled = torch.compile(lambda *a: fg.fused_gemv(*a, head=128), fullgraph=True)
        got_c = compiled(x, w, kind, z, nw, res)
    finally:
        HEAD = prev
    assert rel_err(got, want) < 1e-2 and rel_err(got_c, want) < 1e-2
