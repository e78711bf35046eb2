"""One-row GEMV with an optional RMSNorm of its input and an optional residual add of its output:

    y = residual + W @ rmsnorm(x)        (rmsnorm: Qwen3.5's x / rms(x) * (1 + w); both parts optional)

In the AR step (one token, batch 1) every projection is a GEMV that streams its weight near the card's
copy rate (docs/figures.md), and between two GEMVs sat tiny kernels, all latency. Two of them fold in cheaply:

- the post-attention residual add + RMSNorm (one kernel): the add goes into o_proj / out_proj's
  epilogue, the norm into gate_up's prologue. Every program of a GEMV reads the whole row x
  anyway, so it sums x^2 in the same K loop and scales its dot products by 1/rms at the end (the
  normed row is never rounded to 16 bits, unlike the eager path's: a rounding-level change);
- the residual add after the MLP, into down_proj's epilogue.

An epilogue rounds the projection to the model dtype before adding, as the eager `x + h` sees it.

Other prologues were measured and dropped (docs/kernels.md "Fused GEMV"): SwiGLU, the GDN
output's gated norm, the attention output's sigmoid gate, and the input norm before in_proj made
those GEMVs slower in the graphed step than the kernels they replaced.

One program per BN rows of W, the whole K range in BK steps, fp32 products summed once at the
end, as the plain GEMV of small_m_gemm.py. With PDL (Hopper) the first W tile is loaded before
`gdc_wait`, everything an earlier kernel wrote after it. Configurations are timed once per shape
(`FusedTuner`), like the small-M linear's.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, pdl_launch, require, require_triton
from .small_m_gemm import CONFIGS as _SMALL_M_CONFIGS
from .small_m_gemm import Config, Timer, capturing, correct_candidates, device_timer, time_candidates

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .small_m_gemm import _gemv_w as _w_tile  # one [BN, BK] tile of W, streamed once

    @triton.jit
    def _x_tile(x_ptr, nw_ptr, kk, K, NORM: tl.constexpr):
        """(the GEMV's input for columns kk, x^2), fp32, zero past K. With NORM the input is
        x * (1 + w), unscaled: 1/rms multiplies the sums at the end."""
        mask = kk < K
        x = tl.load(x_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sq = x * x
        if NORM:
            w = tl.load(nw_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x = x * (1.0 + w)
        return x, sq

    @triton.jit
    def _fused_gemv_kernel(x_ptr, nw_ptr, w_ptr, r_ptr, y_ptr, N, K, w_n,
                           NORM: tl.constexpr, EPS: tl.constexpr, HAS_RES: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr = False,
                           EARLY: tl.constexpr = False):
        """Program n block: y[BN] = residual + W[n block] rmsnorm(x). EARLY: `_common.pdl_launch`."""
        DT: tl.constexpr = y_ptr.dtype.element_ty
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_n = offs_n < N
        w_base = w_ptr + offs_n[:, None].to(tl.int64) * w_n
        w = _w_tile(w_base, offs_k, K, mask_n, EVEN_K)  # a weight: no kernel writes it, so before the wait
        if PDL:
            tl.extra.cuda.gdc_wait()
            if EARLY:
                tl.extra.cuda.gdc_launch_dependents()
        x, sq = _x_tile(x_ptr, nw_ptr, offs_k, K, NORM)
        acc = w.to(tl.float32) * x[None, :]
        for k0 in range(BK, K, BK):
            kk = k0 + offs_k
            w = _w_tile(w_base, kk, K, mask_n, EVEN_K)
            x, s = _x_tile(x_ptr, nw_ptr, kk, K, NORM)
            acc += w.to(tl.float32) * x[None, :]
            sq += s
        out = tl.sum(acc, 1)
        if NORM:
            out = out / tl.sqrt(tl.sum(sq, 0) / K + EPS)
        if HAS_RES:  # the eager `x + h`: h rounded to the model dtype, the sum rounded again
            r = tl.load(r_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            out = out.to(DT).to(tl.float32) + r
        tl.store(y_ptr + offs_n, out.to(DT), mask=mask_n)


def _check(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor],
           residual: Optional[torch.Tensor]) -> None:
    require(weight.dim() == 2, f"fused_gemv: weight must be [N, K], got shape {tuple(weight.shape)}")
    N, K = weight.shape
    require(x.numel() == K, f"fused_gemv: x must hold one row of K={K} values, got shape {tuple(x.shape)}")
    require(x.dtype == weight.dtype, f"fused_gemv: x is {x.dtype} but weight is {weight.dtype}")
    tensors = {"x": x, "weight": weight}
    if norm_weight is not None:
        require(norm_weight.numel() == K, f"fused_gemv: norm_weight must hold K={K} values, "
                f"got shape {tuple(norm_weight.shape)}")
        tensors["norm_weight"] = norm_weight
    if residual is not None:
        require(residual.numel() == N and residual.dtype == weight.dtype,
                f"fused_gemv: residual must be one row of N={N} {weight.dtype} values, "
                f"got {tuple(residual.shape)} {residual.dtype}")
        tensors["residual"] = residual
    devices = {t.device for t in tensors.values()}
    require(len(devices) == 1, "fused_gemv: inputs on several devices: "
            + ", ".join(f"{n} on {t.device}" for n, t in tensors.items()))


def _row(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """One contiguous row (a view when it already is one)."""
    return None if t is None else t.reshape(-1).contiguous()


def fused_gemv_reference(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor] = None,
                         residual: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """Plain torch, as the eager layers compute it: RMSNorm, F.linear, residual add ([N])."""
    _check(x, weight, norm_weight, residual)
    h = x.reshape(1, -1)
    if norm_weight is not None:
        hf = h.float()
        h = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + norm_weight.float().reshape(-1))).to(x.dtype)
    y = F.linear(h, weight).reshape(-1)
    return y if residual is None else residual.reshape(-1) + y


DEFAULT = Config(2, 1024, 1, 4, 3, gemv=True)
# The candidates the tuner times: the one-row GEMV configurations of small_m_gemm (its grid winners),
# and one with 8 rows of W per program, which reads x and the norm weight once for more of W.
CONFIGS = tuple(c for c in _SMALL_M_CONFIGS if c.gemv) + (Config(8, 1024, 1, 8, 3, gemv=True),)


def fused_gemv_triton(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor] = None,
                      residual: Optional[torch.Tensor] = None, eps: float = 1e-6,
                      config: Optional[Config] = None) -> torch.Tensor:
    """The Triton kernel: y [N] in weight's dtype (no autograd)."""
    require_triton()
    _check(x, weight, norm_weight, residual)
    cfg = config or DEFAULT
    N, K = weight.shape
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    x1, nw1, r1 = _row(x), _row(norm_weight), _row(residual)
    y = torch.empty(N, device=weight.device, dtype=weight.dtype)
    launch = pdl_launch(weight.device, early=True)
    _fused_gemv_kernel[(triton.cdiv(N, cfg.bn),)](
        x1, x1 if nw1 is None else nw1, weight, x1 if r1 is None else r1, y, N, K, weight.stride(0),
        NORM=norm_weight is not None, EPS=float(eps), HAS_RES=residual is not None,  # EPS: constexpr, see gdn_fused
        BN=cfg.bn, BK=cfg.bk, EVEN_K=K % cfg.bk == 0, num_warps=cfg.warps, num_stages=cfg.stages, **launch)
    return y


class FusedTuner:
    """Per (norm, residual, N, K, dtype, device): the fastest configuration whose output matches the
    reference (no cuBLAS alternative: the unfused path is more than one kernel)."""

    def __init__(self, configs: tuple[Config, ...] = CONFIGS, timer: Optional[Timer] = None, tol: float = 2e-2):
        self.configs, self.timer, self.tol = configs, timer, tol
        self.choice: dict[tuple, Config] = {}
        self.timings: dict[tuple, dict[str, float]] = {}

    def config(self, x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor],
               residual: Optional[torch.Tensor], eps: float) -> Config:
        key = (norm_weight is not None, residual is not None, *weight.shape, weight.dtype, weight.device.index)
        if key in self.choice:
            return self.choice[key]
        if capturing():  # never time inside a capture; the graphs' warm-up tunes first
            return DEFAULT
        xs, nws, rs = (None if t is None else torch.randn_like(t) for t in (x, norm_weight, residual))
        want = fused_gemv_reference(xs, weight, nws, rs, eps).float()
        runs, configs = correct_candidates(self.configs, lambda c: fused_gemv_triton(xs, weight, nws, rs, eps, c),
                                           want, self.tol)
        require(bool(configs), f"fused_gemv: no configuration ran correctly for {weight.shape[0]} x "
                f"{weight.shape[1]} {weight.dtype}")
        times = time_candidates(runs, self.timer or device_timer)
        self.choice[key] = configs[min(configs, key=lambda n: times[n])]
        self.timings[key] = times
        return self.choice[key]

    def report(self) -> list[dict]:
        """Every tuned shape with its winner and timings (us), for benchmark JSON."""
        return [{"norm": key[0], "residual": key[1], "N": key[2], "K": key[3], "choice": self.choice[key].name(),
                 "us": {n: round(ms * 1e3, 2) for n, ms in t.items()}} for key, t in self.timings.items()]


TUNER = FusedTuner()


def _run(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor],
         residual: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    if HAS_TRITON and weight.is_cuda:
        cfg = TUNER.config(x, weight, norm_weight, residual, eps)
        return fused_gemv_triton(x, weight, norm_weight, residual, eps, cfg)
    return fused_gemv_reference(x, weight, norm_weight, residual, eps)


@torch.library.custom_op("ready_kernels::fused_gemv", mutates_args=())
def _fused_gemv_op(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor],
                   residual: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return _run(x, weight, norm_weight, residual, eps)


@_fused_gemv_op.register_fake
def _(x, weight, norm_weight, residual, eps):
    return weight.new_empty(weight.shape[0])


def fused_gemv(x: torch.Tensor, weight: torch.Tensor, norm_weight: Optional[torch.Tensor] = None,
               residual: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """residual + W rmsnorm(x) for one row of K values (any shape), shaped [..., N] like the residual
    (like x without one); inference only. The tuned Triton kernel on CUDA, the eager ops elsewhere;
    inside torch.compile an opaque op (the tuner runs eagerly at run time)."""
    out_shape = (*(x if residual is None else residual).shape[:-1], weight.shape[0])
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.fused_gemv(x, weight, norm_weight, residual, eps).view(out_shape)
    return _run(x, weight, norm_weight, residual, eps).view(out_shape)
