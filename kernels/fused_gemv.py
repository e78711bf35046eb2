"""One-row GEMV with the op before it in its prologue and the residual add in its epilogue.

In the AR step (one token, batch 1) every projection of a decoder layer is a GEMV that streams its
weight at ~4 TB/s, and between two GEMVs sat one or two tiny kernels (RMSNorm, SwiGLU, the GDN
output's gated norm, the attention output's sigmoid gate, the residual add): 1-3 us each, ~0.6 ms
of a 14 ms step at the 27B size, all latency. Here the GEMV computes its input itself while it
loads it, so those kernels disappear:

    y = residual + W @ prologue(x, z)                 (residual optional)

`kind` picks the prologue (the same arithmetic, and the same 16-bit roundings, as the eager layer
code in ready/target/layers.py):

- PLAIN:    x
- RMSNORM:  Qwen3.5's RMSNorm x / rms(x) * (1 + w). Every program reads the whole row anyway, so
            it sums x^2 in the same K loop and scales its dot products by 1/rms at the end (the
            normed row is never rounded to 16 bits, unlike the eager path's: rounding-level change).
- SWIGLU:   silu(x) * z                (x = gate, z = up)
- GATED:    w * rmsnorm_per_head(x) * silu(z), heads of `head` channels, w [head] (the GDN output
            norm; a K tile holds whole heads, so each head's norm is computed inside the tile)
- SIGMOID:  x * sigmoid(z)             (the gated attention output)

One program per BN rows of W, the whole K range in BK steps, fp32 products summed once at the end,
as the plain GEMV of small_m_gemm.py. With PDL (Hopper) the first W tile is loaded before
`gdc_wait`, everything an earlier kernel wrote after it. Configurations are timed once per shape
(`FusedTuner`), like the small-M linear's.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, pdl_enabled, require, require_triton
from .small_m_gemm import CONFIGS as _SMALL_M_CONFIGS
from .small_m_gemm import Config, Timer, _capturing, _device_timer, time_candidates

PLAIN, RMSNORM, SWIGLU, GATED, SIGMOID = 0, 1, 2, 3, 4
KINDS = {"plain": PLAIN, "rmsnorm": RMSNORM, "swiglu": SWIGLU, "gated": GATED, "sigmoid": SIGMOID}
_NEEDS_Z = (SWIGLU, GATED, SIGMOID)
_NEEDS_NORM_WEIGHT = (RMSNORM, GATED)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _round(v, DT: tl.constexpr):
        """v rounded to the model dtype and back to fp32 (where the eager code stores a 16-bit tensor)."""
        return v.to(DT).to(tl.float32)

    @triton.jit
    def _silu(v):
        return v / (1.0 + tl.exp(-v))

    @triton.jit
    def _prologue(x_ptr, z_ptr, nw_ptr, kk, K, KIND: tl.constexpr, HEAD: tl.constexpr, EPS: tl.constexpr,
                  BK: tl.constexpr, DT: tl.constexpr):
        """(the GEMV's input for columns kk, x^2 for RMSNORM's sum), fp32, zero past K.
        RMSNORM's input is x * (1 + w), unscaled: 1/rms multiplies the sums at the end."""
        mask = kk < K
        x = tl.load(x_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        sq = x * x
        if KIND == 1:  # RMSNORM
            w = tl.load(nw_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x = x * (1.0 + w)
        elif KIND == 2:  # SWIGLU
            z = tl.load(z_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x = _round(_round(_silu(x), DT) * z, DT)
        elif KIND == 3:  # GATED: per-head RMSNorm, the head's channel weights, silu(gate)
            z = tl.load(z_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            w = tl.load(nw_ptr + kk % HEAD, eviction_policy="evict_last").to(tl.float32)
            heads = tl.reshape(_round(x, DT), (BK // HEAD, HEAD))
            rstd = 1.0 / tl.sqrt(tl.sum(heads * heads, 1) / HEAD + EPS)
            y = tl.reshape(_round(heads * rstd[:, None], DT), (BK,))
            x = _round(_round(w * y, DT) * _silu(z), DT)
        elif KIND == 4:  # SIGMOID
            z = tl.load(z_ptr + kk, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x = _round(x * _round(tl.sigmoid(z), DT), DT)
        return x, sq

    @triton.jit
    def _w_tile(w_base, kk, K, mask_n, EVEN_K: tl.constexpr):
        """One [BN, BK] tile of W (streamed once: evict first)."""
        if EVEN_K:
            return tl.load(w_base + kk[None, :], mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
        return tl.load(w_base + kk[None, :], mask=mask_n[:, None] & (kk < K)[None, :], other=0.0,
                       eviction_policy="evict_first")

    @triton.jit
    def _fused_gemv_kernel(x_ptr, z_ptr, nw_ptr, w_ptr, r_ptr, y_ptr, N, K, w_n,
                           KIND: tl.constexpr, HEAD: tl.constexpr, EPS: tl.constexpr, HAS_RES: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr = False):
        """Program n block: y[BN] = residual + W[n block] prologue(x)."""
        DT: tl.constexpr = y_ptr.dtype.element_ty
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_n = offs_n < N
        w_base = w_ptr + offs_n[:, None].to(tl.int64) * w_n
        w = _w_tile(w_base, offs_k, K, mask_n, EVEN_K)  # a weight: no kernel writes it, so before the wait
        if PDL:
            tl.extra.cuda.gdc_wait()
        x, sq = _prologue(x_ptr, z_ptr, nw_ptr, offs_k, K, KIND, HEAD, EPS, BK, DT)
        acc = w.to(tl.float32) * x[None, :]
        for k0 in range(BK, K, BK):
            kk = k0 + offs_k
            w = _w_tile(w_base, kk, K, mask_n, EVEN_K)
            x, s = _prologue(x_ptr, z_ptr, nw_ptr, kk, K, KIND, HEAD, EPS, BK, DT)
            acc += w.to(tl.float32) * x[None, :]
            sq += s
        out = tl.sum(acc, 1)
        if KIND == 1:
            out = out / tl.sqrt(tl.sum(sq, 0) / K + EPS)
        if HAS_RES:
            r = tl.load(r_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            out = _round(out, DT) + r
        tl.store(y_ptr + offs_n, out.to(DT), mask=mask_n)


def _kind(kind: int | str) -> int:
    k = KINDS.get(kind, kind) if isinstance(kind, str) else kind
    require(k in KINDS.values(), f"fused_gemv: kind must be one of {sorted(KINDS)}, got {kind!r}")
    return int(k)


def _check(x: torch.Tensor, weight: torch.Tensor, kind: int, z: Optional[torch.Tensor],
           norm_weight: Optional[torch.Tensor], residual: Optional[torch.Tensor], head: int) -> None:
    require(weight.dim() == 2, f"fused_gemv: weight must be [N, K], got shape {tuple(weight.shape)}")
    N, K = weight.shape
    require(x.numel() == K, f"fused_gemv: x must hold one row of K={K} values, got shape {tuple(x.shape)}")
    require(x.dtype in (weight.dtype, torch.float32),
            f"fused_gemv: x must be {weight.dtype} (or float32), got {x.dtype}")
    tensors = {"x": x, "weight": weight}
    if kind in _NEEDS_Z:
        require(z is not None and z.numel() == K, f"fused_gemv: this kind needs z with K={K} values, "
                f"got {None if z is None else tuple(z.shape)}")
        tensors["z"] = z
    if kind == GATED:
        require(head > 0 and head & (head - 1) == 0 and K % head == 0,
                f"fused_gemv: gated norm needs a power-of-two head size dividing K={K}, got head={head}")
    if kind in _NEEDS_NORM_WEIGHT:
        want = head if kind == GATED else K  # the gated norm's weight is per channel of a head
        require(norm_weight is not None and norm_weight.numel() == want,
                f"fused_gemv: this kind needs norm_weight with {want} values, "
                f"got {None if norm_weight is None else tuple(norm_weight.shape)}")
        tensors["norm_weight"] = norm_weight
    if residual is not None:
        require(residual.numel() == N and residual.dtype == weight.dtype,
                f"fused_gemv: residual must be one row of N={N} {weight.dtype} values, "
                f"got {tuple(residual.shape)} {residual.dtype}")
        tensors["residual"] = residual
    devices = {t.device for t in tensors.values()}
    require(len(devices) == 1, f"fused_gemv: inputs on several devices: "
            + ", ".join(f"{n} on {t.device}" for n, t in tensors.items()))


def _row(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """One contiguous row (a view when it already is one)."""
    return None if t is None else t.reshape(-1).contiguous()


def prologue_reference(x: torch.Tensor, kind: int, z: Optional[torch.Tensor] = None,
                       norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6, head: int = 0,
                       dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The GEMV's input as the eager layer code computes it, in `dtype` (default x's)."""
    dtype = dtype or x.dtype
    if kind == PLAIN:
        return x.to(dtype)
    if kind == RMSNORM:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * (1.0 + norm_weight.float())).to(dtype)
    if kind == SWIGLU:
        return F.silu(x.to(dtype)) * z.to(dtype)
    if kind == SIGMOID:
        return x.to(dtype) * torch.sigmoid(z.to(dtype))
    shape = x.shape  # GATED
    xh = x.to(dtype).reshape(*shape[:-1], shape[-1] // head, head).float()
    y = (xh * torch.rsqrt(xh.pow(2).mean(-1, keepdim=True) + eps)).to(dtype).reshape(shape)
    w = norm_weight.to(dtype).reshape(-1).repeat(shape[-1] // head)
    return (w * y * F.silu(z.float().reshape(shape))).to(dtype)


def fused_gemv_reference(x: torch.Tensor, weight: torch.Tensor, kind: int | str = PLAIN,
                         z: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None,
                         residual: Optional[torch.Tensor] = None, eps: float = 1e-6, head: int = 0) -> torch.Tensor:
    """Plain torch: the eager layer ops, then F.linear, then the residual add ([N] for one row of x)."""
    kind = _kind(kind)
    _check(x, weight, kind, z, norm_weight, residual, head)
    xin = prologue_reference(x.reshape(1, -1), kind, None if z is None else z.reshape(1, -1),
                             norm_weight, eps, head, weight.dtype)
    y = F.linear(xin, weight).reshape(-1)
    return y if residual is None else residual.reshape(-1) + y


DEFAULT = Config(2, 1024, 1, 4, 3, gemv=True)
# The candidates the tuner times: the one-row GEMV configurations of small_m_gemm, and two that read
# x (and its norm weight / gate) for more rows of W per program, which the prologue's extra loads favour.
CONFIGS = tuple(c for c in _SMALL_M_CONFIGS if c.gemv) + (Config(8, 1024, 1, 8, 3, gemv=True),
                                                          Config(16, 512, 1, 8, 3, gemv=True))


def runs(cfg: Config, kind: int, head: int) -> bool:
    """Whether a configuration can compute this kind: a gated norm's K tile must hold whole heads."""
    return kind != GATED or (cfg.bk % head == 0)


def fused_gemv_triton(x: torch.Tensor, weight: torch.Tensor, kind: int | str = PLAIN,
                      z: Optional[torch.Tensor] = None, norm_weight: Optional[torch.Tensor] = None,
                      residual: Optional[torch.Tensor] = None, eps: float = 1e-6, head: int = 0,
                      config: Optional[Config] = None) -> torch.Tensor:
    """The Triton kernel: y [N] in weight's dtype (no autograd)."""
    require_triton()
    kind = _kind(kind)
    _check(x, weight, kind, z, norm_weight, residual, head)
    cfg = config or DEFAULT
    require(runs(cfg, kind, head), f"fused_gemv: configuration {cfg.name()} splits heads of {head} channels "
            f"(BK={cfg.bk} is not a multiple)")
    N, K = weight.shape
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    x1, z1, nw1, r1 = _row(x), _row(z), _row(norm_weight), _row(residual)
    y = torch.empty(N, device=weight.device, dtype=weight.dtype)
    dummy = x1  # never read: the kind or HAS_RES switches the load off
    launch = {"launch_pdl": True, "PDL": True} if pdl_enabled(weight.device) else {}
    _fused_gemv_kernel[(triton.cdiv(N, cfg.bn),)](
        x1, dummy if z1 is None else z1, dummy if nw1 is None else nw1, weight,
        dummy if r1 is None else r1, y, N, K, weight.stride(0),
        KIND=kind, HEAD=max(head, 1), EPS=float(eps), HAS_RES=residual is not None,
        BN=cfg.bn, BK=cfg.bk, EVEN_K=K % cfg.bk == 0, num_warps=cfg.warps, num_stages=cfg.stages, **launch)
    return y


class FusedTuner:
    """Per (kind, head, N, K, dtype, device): the fastest configuration whose output matches the
    reference (the fused op has no cuBLAS alternative: the unfused path is several kernels)."""

    def __init__(self, configs: tuple[Config, ...] = CONFIGS, timer: Optional[Timer] = None, tol: float = 2e-2):
        self.configs, self.timer, self.tol = configs, timer, tol
        self.choice: dict[tuple, Config] = {}
        self.timings: dict[tuple, dict[str, float]] = {}

    def config(self, x: torch.Tensor, weight: torch.Tensor, kind: int, z, norm_weight, residual, eps: float,
               head: int) -> Config:
        key = (kind, head, weight.shape[0], weight.shape[1], weight.dtype, weight.device.index)
        if key in self.choice:
            return self.choice[key]
        if _capturing():  # never time inside a capture; the graphs' warm-up tunes first
            return DEFAULT if runs(DEFAULT, kind, head) else next(c for c in self.configs if runs(c, kind, head))
        args = [torch.randn_like(t) if t is not None else None for t in (x, z, norm_weight, residual)]
        want = fused_gemv_reference(args[0], weight, kind, args[1], args[2], args[3], eps, head).float()
        scale = want.norm().clamp_min(1e-30)
        run_fns: dict[str, Callable[[], object]] = {}
        configs: dict[str, Config] = {}
        for cfg in self.configs:
            if not runs(cfg, kind, head):
                continue
            try:
                got = fused_gemv_triton(args[0], weight, kind, args[1], args[2], args[3], eps, head, cfg).float()
            except Exception:  # a configuration this device cannot run (resources): skip it
                continue
            if not bool(torch.isfinite(got).all()) or float((got - want).norm() / scale) > self.tol:
                continue
            run_fns[cfg.name()] = lambda c=cfg: fused_gemv_triton(args[0], weight, kind, args[1], args[2], args[3],
                                                                  eps, head, c)
            configs[cfg.name()] = cfg
        require(bool(configs), f"fused_gemv: no configuration ran correctly for {weight.shape[0]} x "
                f"{weight.shape[1]} ({weight.dtype}, kind {kind})")
        times = time_candidates(run_fns, self.timer or _device_timer)
        self.choice[key] = configs[min(configs, key=lambda n: times[n])]
        self.timings[key] = times
        return self.choice[key]

    def report(self) -> list[dict]:
        """Every tuned shape with its winner and timings (us), for benchmark JSON."""
        names = {v: k for k, v in KINDS.items()}
        return [{"kind": names[key[0]], "N": key[2], "K": key[3], "choice": self.choice[key].name(),
                 "us": {n: round(ms * 1e3, 2) for n, ms in t.items()}} for key, t in self.timings.items()]


TUNER = FusedTuner()


def _run(x: torch.Tensor, weight: torch.Tensor, kind: int, z: Optional[torch.Tensor],
         norm_weight: Optional[torch.Tensor], residual: Optional[torch.Tensor], eps: float, head: int) -> torch.Tensor:
    if HAS_TRITON and weight.is_cuda:
        cfg = TUNER.config(x, weight, kind, z, norm_weight, residual, eps, head)
        return fused_gemv_triton(x, weight, kind, z, norm_weight, residual, eps, head, cfg)
    return fused_gemv_reference(x, weight, kind, z, norm_weight, residual, eps, head)


@torch.library.custom_op("ready_kernels::fused_gemv", mutates_args=())
def _fused_gemv_op(x: torch.Tensor, weight: torch.Tensor, kind: int, z: Optional[torch.Tensor],
                   norm_weight: Optional[torch.Tensor], residual: Optional[torch.Tensor], eps: float,
                   head: int) -> torch.Tensor:
    return _run(x, weight, kind, z, norm_weight, residual, eps, head)


@_fused_gemv_op.register_fake
def _(x, weight, kind, z, norm_weight, residual, eps, head):
    return weight.new_empty(weight.shape[0])


def fused_gemv(x: torch.Tensor, weight: torch.Tensor, kind: int | str = PLAIN, z: Optional[torch.Tensor] = None,
               norm_weight: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
               eps: float = 1e-6, head: int = 0) -> torch.Tensor:
    """residual + W prologue(x, z) for one row of K values (any shape: a GDN or attention output's
    heads are one row), shaped [..., N] like the residual (like x without one); inference only. The
    tuned Triton kernel on CUDA, the eager ops elsewhere; inside torch.compile an opaque op (the
    tuner runs eagerly at run time)."""
    kind = _kind(kind)
    out_shape = (*(x if residual is None else residual).shape[:-1], weight.shape[0])
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.fused_gemv(x, weight, kind, z, norm_weight, residual, eps, head).view(out_shape)
    return _run(x, weight, kind, z, norm_weight, residual, eps, head).view(out_shape)
