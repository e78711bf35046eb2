"""Small-M linear: y = x W^T for a handful of rows x (decode M = 1, verify M = K+1, drafting M = K).

At batch 1 every target projection multiplies 1..8 token rows by a weight that is hundreds of MB:
the op is a stream of W through the GPU, and its speed is the rate at which W is read. cuBLAS
picks GEMV kernels near that rate for M = 1, but for M = 2..8 its small-M GEMMs read W markedly
slower, so a verify of 2 tokens cost far more than an AR step (docs/kernels.md "Small-M linear").

The Triton kernel here reads every W element once: one program per (BN rows of W, K slice),
the x rows padded to 16 for `tl.dot`, fp32 accumulation. With SPLIT > 1 the K range is split
over SPLIT programs that write fp32 partials, and a second small kernel adds them and casts
(more programs in flight for weights with few rows, e.g. N = 5120). For one row (the AR step) a
GEMV kernel without `tl.dot` takes as few as 2 rows of W per program (`tl.dot` needs 16), so a
weight with few rows still fills every SM with many short programs and the last wave stays short.

`small_m_linear` (dispatch) picks, per (M, N, K, dtype, with or without the residual add), the
fastest of cuBLAS (`F.linear`) and the Triton configurations, timed once on the device the first
time that shape is seen outside CUDA-graph capture (`SmallMTuner`), each as the step runs it: the
weight cold in HBM, the add included (a separate kernel after cuBLAS); a candidate whose output
differs from `F.linear` beyond rounding is never picked. Off CUDA, under autograd, for M > MAX_M,
or while a CUDA graph is being captured before the shape was tuned, it is `F.linear`.
`torch.ops.ready_kernels.small_m_linear` is the same dispatch as an opaque custom op, so
`torch.compile`d code can call it.
`small_m_linear_add` (op `ready_kernels::small_m_linear_add`) is residual + x W^T with the add in
the Triton store (or the split-K sum): the layer's last residual add, one kernel less per layer.

Modes (`set_mode`): `auto` (default: tuned choice), `torch` (always `F.linear`), `triton` (always
the Triton kernel with the default configuration; tests).
On Hopper every launch is a programmatic dependent one (`_common.pdl_enabled`): inside a CUDA graph
the GEMV starts streaming W while the kernel before it finishes, and reads x only after `gdc_wait`.
The tuners time candidates from a CUDA graph (`device_timer`).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, pdl_launch, require, require_triton

MAX_M = 16  # rows padded into one 16-row tl.dot tile
# Triton's CPU interpreter multiplies bf16 tiles wrongly (it has no bf16 dot), so interpreted runs
# upcast the tiles to fp32 first; compiled runs multiply 16-bit tiles on tensor cores.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _small_m_kernel(x_ptr, w_ptr, y_ptr, r_ptr, M, N, K, x_m, w_n, y_s, y_m, K_SPLIT,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                        EVEN_K: tl.constexpr, IEEE: tl.constexpr, RESIDUAL: tl.constexpr = False,
                        PDL: tl.constexpr = False, EARLY: tl.constexpr = False):
        """Program (n block, k slice): acc[BM, BN] = x[:, slice] W[n block, slice]^T in fp32.

        SPLIT == 1 stores acc in y's dtype (RESIDUAL: plus r [M, N], `_with_residual`); otherwise the
        fp32 partial goes to y + pid_k * y_s.
        PDL: launched as a programmatic dependent; waits for the kernel before it first.
        EARLY: then lets the next kernel launch (`_common.pdl_launch`)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            if EARLY:
                tl.extra.cuda.gdc_launch_dependents()
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_m = tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_m = offs_m < M
        mask_n = offs_n < N
        k_lo = pid_k * K_SPLIT
        x_base = x_ptr + offs_m[:, None].to(tl.int64) * x_m
        w_base = w_ptr + offs_n[:, None].to(tl.int64) * w_n
        k_hi = tl.minimum(k_lo + K_SPLIT, K)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            kk = k0 + offs_k
            if EVEN_K:
                x = tl.load(x_base + kk[None, :], mask=mask_m[:, None], other=0.0)
                w = tl.load(w_base + kk[None, :], mask=mask_n[:, None], other=0.0)
            else:
                mask_k = kk < K
                x = tl.load(x_base + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                w = tl.load(w_base + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            if IEEE:  # fp32 operands (or 16-bit ones upcast under the interpreter, whose dot lacks bf16)
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        y = y_ptr + pid_k.to(tl.int64) * y_s + offs_m[:, None] * y_m + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        if SPLIT == 1:
            out = acc.to(y_ptr.dtype.element_ty)
            if RESIDUAL:
                out = _with_residual(out, r_ptr + offs_m[:, None] * y_m + offs_n[None, :], mask)
            tl.store(y, out, mask=mask)
        else:
            tl.store(y, acc, mask=mask)

    @triton.jit
    def _with_residual(y, r_ptrs, mask):
        """r + y for y already rounded to the output dtype: added in fp32 and rounded once more, the
        arithmetic of a separate `r + y` (so the fused add gives the same bits)."""
        r = tl.load(r_ptrs, mask=mask, other=0.0)
        return (r.to(tl.float32) + y.to(tl.float32)).to(y.dtype)

    @triton.jit
    def _gemv_w(w_base, kk, K, mask_n, EVEN_K: tl.constexpr):
        """One [BN, BK] tile of W (streamed once: evict first)."""
        if EVEN_K:
            return tl.load(w_base + kk[None, :], mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
        return tl.load(w_base + kk[None, :], mask=mask_n[:, None] & (kk < K)[None, :], other=0.0,
                       eviction_policy="evict_first")

    @triton.jit
    def _gemv_x(x_ptr, kk, K, EVEN_K: tl.constexpr):
        """One [BK] slice of the row x (read by every program: evict last)."""
        if EVEN_K:
            return tl.load(x_ptr + kk, eviction_policy="evict_last")
        return tl.load(x_ptr + kk, mask=kk < K, other=0.0, eviction_policy="evict_last")

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, r_ptr, N, K, w_n,
                     BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr = False,
                     PDL: tl.constexpr = False, EARLY: tl.constexpr = False):
        """Program n block: y[BN] = W[n block] x for one row x, fp32 products summed once at the end
        (RESIDUAL: plus r [N]).

        PDL: launched as a programmatic dependent. The first W tile (a weight no kernel writes) is
        loaded while the kernel before this one still runs; x, its output, only after the wait.
        EARLY: then lets the next kernel launch (`_common.pdl_launch`)."""
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        mask_n = offs_n < N
        w_base = w_ptr + offs_n[:, None].to(tl.int64) * w_n
        acc = tl.zeros([BN, BK], dtype=tl.float32)
        start = 0
        if PDL:
            w = _gemv_w(w_base, offs_k, K, mask_n, EVEN_K)
            tl.extra.cuda.gdc_wait()
            if EARLY:
                tl.extra.cuda.gdc_launch_dependents()
            acc += w.to(tl.float32) * _gemv_x(x_ptr, offs_k, K, EVEN_K).to(tl.float32)[None, :]
            start = BK
        for k0 in range(start, K, BK):
            kk = k0 + offs_k
            w = _gemv_w(w_base, kk, K, mask_n, EVEN_K)
            acc += w.to(tl.float32) * _gemv_x(x_ptr, kk, K, EVEN_K).to(tl.float32)[None, :]
        out = tl.sum(acc, 1).to(y_ptr.dtype.element_ty)
        if RESIDUAL:
            out = _with_residual(out, r_ptr + offs_n, mask_n)
        tl.store(y_ptr + offs_n, out, mask=mask_n)

    @triton.jit
    def _split_sum_kernel(p_ptr, y_ptr, r_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                          RESIDUAL: tl.constexpr = False, PDL: tl.constexpr = False):
        """y[i] = sum_s p[s, i] (fp32 partials), cast to y's dtype (RESIDUAL: plus r[i])."""
        if PDL:
            tl.extra.cuda.gdc_wait()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < MN
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
        out = acc.to(y_ptr.dtype.element_ty)
        if RESIDUAL:
            out = _with_residual(out, r_ptr + offs, mask)
        tl.store(y_ptr + offs, out, mask=mask)


@dataclass(frozen=True)
class Config:
    """One Triton launch shape: BN rows of W per program, BK columns per step, SPLIT slices of K;
    `gemv`: the one-row kernel (no tl.dot, no split; only for M = 1)."""

    bn: int = 32
    bk: int = 256
    split: int = 1
    warps: int = 4
    stages: int = 4
    gemv: bool = False

    def name(self) -> str:
        return f"{'gemv_' if self.gemv else ''}bn{self.bn}_bk{self.bk}_s{self.split}_w{self.warps}_st{self.stages}"

    def runs(self, m: int) -> bool:
        """Whether this configuration can multiply m rows."""
        return m == 1 or not self.gemv

    def offered(self, m: int) -> bool:
        """Whether the tuner times it for m rows (the ones it runs)."""
        return self.runs(m)


DEFAULT = Config()
# The candidates the tuner times (chosen from H200 sweeps: docs/kernels.md "Small-M linear"; figures:
# docs/figures.md "Kernels").
CONFIGS = (
    Config(16, 256, 1, 4, 4), Config(32, 256, 1, 4, 4), Config(64, 128, 1, 4, 4), Config(64, 256, 1, 4, 3),
    Config(16, 512, 1, 4, 3), Config(32, 512, 1, 4, 3), Config(32, 128, 1, 4, 5), Config(128, 128, 1, 8, 3),
    Config(32, 256, 2, 4, 4), Config(64, 256, 2, 4, 4), Config(64, 256, 4, 4, 4), Config(128, 128, 4, 8, 3),
    # weights with few rows (N = 5120): 16-row blocks split over K, many programs, so the last wave is short
    Config(16, 256, 2, 4, 4), Config(16, 256, 3, 4, 4), Config(16, 256, 4, 4, 4), Config(16, 512, 2, 4, 3),
    Config(16, 512, 4, 4, 3), Config(32, 256, 3, 4, 4), Config(16, 128, 4, 2, 6), Config(16, 256, 1, 2, 6),
    # the 8-row down projection (5120 x 17408): faster than the best above in a cold-weight graph-timed grid
    # (H200, `benchmarks.small_m --grid`, docs/data/cold_tuner_h200_grid_m8.json)
    Config(32, 256, 2, 4, 3),
    # one row (the AR step): the GEMV kernel, 1..8 rows of W per program (the winners of an 81-config
    # grid on the 27B shapes, docs/data/small_m_gemv_grid_h200.json)
    Config(2, 1024, 1, 4, 3, gemv=True), Config(4, 1024, 1, 2, 4, gemv=True), Config(2, 2048, 1, 8, 3, gemv=True),
    Config(1, 512, 1, 4, 2, gemv=True), Config(2, 512, 1, 2, 3, gemv=True), Config(1, 2048, 1, 4, 3, gemv=True),
    Config(4, 1024, 1, 8, 4, gemv=True), Config(8, 512, 1, 4, 3, gemv=True),
)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    require(weight.dim() == 2, f"small_m_linear: weight must be [N, K], got shape {tuple(weight.shape)}")
    require(x.dim() >= 1 and x.shape[-1] == weight.shape[1],
            f"small_m_linear: x's last dim must be K={weight.shape[1]}, got shape {tuple(x.shape)}")
    require(x.device == weight.device, f"small_m_linear: x on {x.device} but weight on {weight.device}")
    require(x.dtype == weight.dtype, f"small_m_linear: x is {x.dtype} but weight is {weight.dtype}")


def _check_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> None:
    want = (*x.shape[:-1], weight.shape[0])
    require(tuple(residual.shape) == want,
            f"small_m_linear: residual must have shape {want} (x's rows by N), got {tuple(residual.shape)}")
    require(residual.dtype == x.dtype and residual.device == x.device,
            f"small_m_linear: residual is {residual.dtype} on {residual.device}, expected {x.dtype} on {x.device}")


def small_m_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Plain torch: F.linear (cuBLAS on CUDA)."""
    _check(x, weight)
    return F.linear(x, weight)


def small_m_linear_triton(x: torch.Tensor, weight: torch.Tensor, config: Optional[Config] = None,
                          out: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The Triton kernel for x [..., K] with at most MAX_M rows; y [..., N] in x's dtype (no autograd).
    `residual` [..., N]: y = residual + x W^T, the add in the store (the arithmetic of a separate add).

    fp32 inputs multiply in IEEE fp32 (FMA accuracy); 16-bit inputs on tensor cores, fp32 accumulate."""
    require_triton()
    _check(x, weight)
    if residual is not None:
        _check_residual(x, weight, residual)
    cfg = config or DEFAULT
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    M = x2.shape[0]
    require(M <= MAX_M, f"small_m_linear_triton: at most {MAX_M} rows, got {M}")
    require(cfg.runs(M), f"small_m_linear_triton: configuration {cfg.name()} multiplies one row, got {M}")
    y = out if out is not None else torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 0:
        return y.reshape(*x.shape[:-1], N)
    has_r = residual is not None
    r = residual.reshape(M, N).contiguous() if has_r else y  # y: an unread placeholder
    launch = pdl_launch(x.device, early=True)
    if cfg.gemv:
        _gemv_kernel[(triton.cdiv(N, cfg.bn),)](x2, weight, y, r, N, K, weight.stride(0), BN=cfg.bn, BK=cfg.bk,
                                                EVEN_K=K % cfg.bk == 0, RESIDUAL=has_r, num_warps=cfg.warps,
                                                num_stages=cfg.stages, **launch)
        return y.reshape(*x.shape[:-1], N)
    split = max(1, min(cfg.split, -(-K // cfg.bk)))
    k_split = -(-K // (split * cfg.bk)) * cfg.bk  # every slice a whole number of BK steps
    split = -(-K // k_split)
    even = K % cfg.bk == 0
    grid = (triton.cdiv(N, cfg.bn), split)
    ieee = x.dtype == torch.float32 or _INTERPRETED
    # enable_fp_fusion pinned (exact mode's bits must not follow TRITON_DEFAULT_FP_FUSION or Triton 3.10's default)
    if split == 1:
        _small_m_kernel[grid](x2, weight, y, r, M, N, K, x2.stride(0), weight.stride(0), 0, N, k_split,
                              BM=16, BN=cfg.bn, BK=cfg.bk, SPLIT=1, EVEN_K=even, IEEE=ieee, RESIDUAL=has_r,
                              num_warps=cfg.warps, num_stages=cfg.stages, enable_fp_fusion=True, **launch)
    else:
        part = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
        _small_m_kernel[grid](x2, weight, part, part, M, N, K, x2.stride(0), weight.stride(0), M * N, N, k_split,
                              BM=16, BN=cfg.bn, BK=cfg.bk, SPLIT=split, EVEN_K=even, IEEE=ieee,
                              num_warps=cfg.warps, num_stages=cfg.stages, enable_fp_fusion=True, **launch)
        block = 1024
        _split_sum_kernel[(triton.cdiv(M * N, block),)](part, y, r, M * N, SPLIT=split, BLOCK=block,
                                                        RESIDUAL=has_r, num_warps=4, enable_fp_fusion=True,
                                                        **pdl_launch(x.device))
    return y.reshape(*x.shape[:-1], N)


# --- choosing between cuBLAS and the Triton configurations ---------------------------------------

Timer = Callable[[Callable[[], object]], float]


def device_timer(fn: Callable[[], object]) -> float:
    """Median ms of fn on the device: do_bench_cudagraph, the calls replayed from one CUDA graph, as
    the engine runs them, so a busy host (e.g. compile workers during a warm-up) cannot stretch a short
    kernel's time to its Python launch time; L2 is not flushed (`SmallMTuner` rotates copies of a large
    weight instead, `cold_weights`). Timing each call launched from Python (triton's do_bench) made the
    tuner's choices change from process to process (docs/kernels.md "Tuning from a CUDA graph")."""
    return float(triton.testing.do_bench_cudagraph(fn, rep=12, return_mode="median"))


TIMING_ROUNDS = 2


def time_candidates(runs: dict[str, Callable[[], object]], timer: Timer, rounds: int = TIMING_ROUNDS) -> dict[str, float]:
    """Each candidate's best time over `rounds` rounds, every other round in reverse order, after one
    discarded warm-up timing: a GPU that is still raising its clocks, or one noisy sample, then
    cannot decide the choice (single passes picked different kernels on one machine from run to run)."""
    names = list(runs)
    if names:
        timer(runs[names[0]])
    best = {n: float("inf") for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            best[n] = min(best[n], timer(runs[n]))
    return best


def correct_candidates(configs, run: Callable[[Config], torch.Tensor], want: torch.Tensor,
                       tol: float) -> tuple[dict[str, Callable[[], object]], dict[str, Config]]:
    """The configurations that run here and whose output `run(cfg)` matches `want` within relative
    `tol`: (name -> timing closure, name -> configuration), in the order given."""
    scale = want.norm().clamp_min(1e-30)
    runs: dict[str, Callable[[], object]] = {}
    kept: dict[str, Config] = {}
    for cfg in configs:
        try:
            got = run(cfg).float()
        except Exception:  # a configuration this device cannot run (resources): skip it
            continue
        if not bool(torch.isfinite(got).all()) or float((got - want).norm() / scale) > tol:
            continue
        runs[cfg.name()], kept[cfg.name()] = (lambda c=cfg: run(c)), cfg
    return runs, kept


def cold_weights(weight: torch.Tensor) -> list[torch.Tensor]:
    """The weight and enough copies of it that timing calls which rotate over them find each one out
    of L2, as the step does (it streams ~50 GB of weights per token, so no weight is L2-resident when
    its turn comes). Only weights between an eighth of L2 and twice L2 are copied: a smaller one is
    L2-warm in a timing loop and in a small model's step alike, a larger one streams through L2 on its
    own (the LM head is not copied). Off CUDA: just the weight."""
    if not weight.is_cuda:
        return [weight]
    l2 = torch.cuda.get_device_properties(weight.device).L2_cache_size
    size = weight.numel() * weight.element_size()
    if size * 8 < l2 or size >= 2 * l2:
        return [weight]
    return [weight] + [weight.clone() for _ in range(-(-2 * l2 // size))]  # the rotation spans >= 2 x L2


class SmallMTuner:
    """Per (M, N, K, dtype, device, residual): the fastest correct candidate, None meaning F.linear.

    Candidates are timed as the step runs them: the weight read cold from HBM (`cold_weights`), and for
    `small_m_linear_add` with the residual add (cuBLAS: F.linear then a separate add kernel; Triton: the
    add in the store)."""

    def __init__(self, configs: tuple[Config, ...] = CONFIGS, timer: Optional[Timer] = None, tol: float = 2e-2):
        self.configs, self.timer, self.tol = configs, timer, tol
        self.choice: dict[tuple, Optional[Config]] = {}
        self.timings: dict[tuple, dict[str, float]] = {}

    @staticmethod
    def key(x2: torch.Tensor, weight: torch.Tensor, residual: bool = False) -> tuple:
        return (x2.shape[0], weight.shape[0], weight.shape[1], x2.dtype, x2.device.index, residual)

    def lookup(self, x2: torch.Tensor, weight: torch.Tensor, residual: bool = False) -> tuple[bool, Optional[Config]]:
        """(known, choice). A shape tuned only for more rows (the verify block) lends its choice to
        fewer rows (the shortened last round) without timing again: any configuration runs any M."""
        k = self.key(x2, weight, residual)
        if k in self.choice:
            return True, self.choice[k]
        more = sorted(m for (m, *rest) in self.choice if tuple(rest) == k[1:] and m > k[0])
        if more:
            self.choice[k] = self.choice[(more[0],) + k[1:]]
            return True, self.choice[k]
        return False, None

    def tune(self, x2: torch.Tensor, weight: torch.Tensor, residual: bool = False) -> Optional[Config]:
        """Time F.linear and every configuration on these operands (`residual`: with the add);
        remember and return the winner."""
        k = self.key(x2, weight, residual)
        x2 = torch.randn_like(x2)  # never time or check on the caller's (maybe zero) rows
        r = torch.randn(x2.shape[0], weight.shape[0], device=x2.device, dtype=x2.dtype) if residual else None
        want = F.linear(x2, weight).float() if r is None else (r + F.linear(x2, weight)).float()
        offered = [c for c in self.configs if c.offered(x2.shape[0])]
        _, configs = correct_candidates(offered, lambda c: small_m_linear_triton(x2, weight, c, residual=r), want,
                                        self.tol)
        ws = itertools.cycle(cold_weights(weight))
        runs: dict[str, Callable[[], object]] = {
            "torch": lambda: F.linear(x2, next(ws)) if r is None else r + F.linear(x2, next(ws)),
            **{n: (lambda c=c: small_m_linear_triton(x2, next(ws), c, residual=r)) for n, c in configs.items()}}
        times = time_candidates(runs, self.timer or device_timer)
        best = min(configs, key=lambda n: times[n], default=None)
        self.choice[k] = configs[best] if best is not None and times[best] < times["torch"] else None
        self.timings[k] = times
        return self.choice[k]

    def report(self) -> list[dict]:
        """Every tuned shape with its winner and timings (ms), for benchmark JSON."""
        rows = []
        for key, t in self.timings.items():
            m, n, k, dt, _, res = key
            cfg = self.choice[key]
            rows.append({"M": m, "N": n, "K": k, "dtype": str(dt).replace("torch.", ""), "residual": res,
                         "choice": "torch" if cfg is None else cfg.name(),
                         "us": {name: round(ms * 1e3, 2) for name, ms in t.items()},
                         "weight_GBps_best": round(n * k * torch.finfo(dt).bits / 8 / (min(t.values()) * 1e-3) / 1e9, 1)})
        return rows


TUNER = SmallMTuner()
_MODE = "auto"


def set_mode(mode: str) -> str:
    """`auto` | `torch` | `triton`; returns the previous mode."""
    global _MODE
    require(mode in ("auto", "torch", "triton"), f"small_m_linear mode must be auto, torch or triton, got {mode!r}")
    prev, _MODE = _MODE, mode
    return prev


def get_mode() -> str:
    return _MODE


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no tuning then)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _dispatch(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    r2 = None if residual is None else residual.reshape(-1, N)
    if _MODE == "triton":
        return small_m_linear_triton(x2, weight, residual=r2).reshape(*x.shape[:-1], N)
    known, cfg = TUNER.lookup(x2, weight, residual is not None)
    if not known and not capturing():
        cfg = TUNER.tune(x2, weight, residual is not None)
    if cfg is None:
        return F.linear(x, weight) if residual is None else residual + F.linear(x, weight)
    return small_m_linear_triton(x2, weight, cfg, residual=r2).reshape(*x.shape[:-1], N)


def eligible(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `small_m_linear` may leave F.linear: CUDA, Triton, no autograd, few rows, 16-bit
    (fp32 too in `triton` mode, for exactness tests), a contiguous 2-d weight."""
    if _MODE == "torch" or not HAS_TRITON or not x.is_cuda or weight.dim() != 2:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    if x.dtype != weight.dtype or weight.stride(-1) != 1 or x.shape[-1] != weight.shape[1]:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) and not (_MODE == "triton" and x.dtype == torch.float32):
        return False
    return 0 < x.numel() // max(1, x.shape[-1]) <= MAX_M


# --- exact mode: one kernel and one reduction order for every row count ----------------------------
#
# `exact_linear` gives every row of x the same bits whether it is multiplied alone (the AR step,
# M = 1) or among K+1 rows (verify): on CUDA one Triton configuration per weight shape (N, K, dtype),
# whatever M, with the rows padded into one 16-row tile (a row's dot products never see the other
# rows, and the K loop, the tile order and, with SPLIT > 1, the partial-sum order are fixed by the
# configuration alone); more than 16 rows go through in 16-row chunks. cuBLAS is never used: it picks
# another kernel per M. Elsewhere (CPU) every row is its own F.linear call on a fresh copy of the row,
# the very call the AR step makes. The configuration of a weight shape is the fastest Triton
# candidate, timed once at its first use outside CUDA-graph capture (`DEFAULT` when first seen during
# a capture), and then fixed for the process.

EXACT_CHOICE: dict[tuple, Config] = {}
EXACT_TIMINGS: dict[tuple, dict[str, float]] = {}


def _exact_key(weight: torch.Tensor) -> tuple:
    return (weight.shape[0], weight.shape[1], weight.dtype, weight.device.index)


def exact_config(x2: torch.Tensor, weight: torch.Tensor, timer: Optional[Timer] = None) -> Config:
    """The one configuration used for this weight shape at every M (chosen on first use, then fixed)."""
    key = _exact_key(weight)
    if key in EXACT_CHOICE:
        return EXACT_CHOICE[key]
    if capturing():
        EXACT_CHOICE[key] = DEFAULT
        return DEFAULT
    timer = timer or device_timer
    xt = torch.randn(min(max(x2.shape[0], 1), MAX_M), weight.shape[1], device=weight.device, dtype=weight.dtype)
    want = F.linear(xt.float(), weight.float())
    multi_row = (c for c in TUNER.configs if not c.gemv)  # one configuration for every row count: never the GEMV
    runs, configs = correct_candidates(multi_row, lambda c: small_m_linear_triton(xt, weight, c), want, TUNER.tol)
    times = time_candidates(runs, timer)
    best = configs[min(configs, key=lambda n: times[n])] if configs else DEFAULT
    EXACT_CHOICE[key], EXACT_TIMINGS[key] = best, times
    return best


def exact_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row by row: F.linear of each row alone, on a fresh (aligned, contiguous) copy of it."""
    _check(x, weight)
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    rows = [F.linear(x2[i:i + 1].clone(), weight) for i in range(x2.shape[0])]
    y = torch.cat(rows) if rows else x2.new_empty(0, N)
    return y.reshape(*x.shape[:-1], N)


def exact_linear_triton(x: torch.Tensor, weight: torch.Tensor, config: Optional[Config] = None) -> torch.Tensor:
    """The Triton kernel with one configuration for every M, in chunks of at most MAX_M rows."""
    _check(x, weight)
    N, K = weight.shape
    x2 = x.reshape(-1, K)
    cfg = config or exact_config(x2, weight)
    if x2.shape[0] <= MAX_M:
        y = small_m_linear_triton(x2, weight, cfg)
    else:
        y = torch.cat([small_m_linear_triton(x2[i:i + MAX_M], weight, cfg) for i in range(0, x2.shape[0], MAX_M)])
    return y.reshape(*x.shape[:-1], N)


@torch.library.custom_op("ready_kernels::exact_linear", mutates_args=())
def _exact_linear_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if HAS_TRITON and x.is_cuda:
        return exact_linear_triton(x, weight)
    return exact_linear_reference(x, weight)


@_exact_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def exact_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x W^T, each row bit-identical whatever the number of rows (inference; F.linear under autograd)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return F.linear(x, weight)
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.exact_linear(x, weight)
    return _exact_linear_op(x, weight)


# The op exists everywhere (its CPU path is F.linear), so compiled code can always name it.
@torch.library.custom_op("ready_kernels::small_m_linear", mutates_args=())
def _small_m_linear_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if eligible(x, weight):
        return _dispatch(x, weight)
    return F.linear(x, weight)


@_small_m_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def small_m_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x W^T (no bias): the tuned fast path where `eligible`, F.linear otherwise.

    Inside torch.compile it goes through the opaque custom op (the tuner runs eagerly at run time)."""
    if not eligible(x, weight):
        return F.linear(x, weight)
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.small_m_linear(x, weight)
    return _dispatch(x, weight)


@torch.library.custom_op("ready_kernels::small_m_linear_add", mutates_args=())
def _small_m_linear_add_op(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    if eligible(x, weight):
        return _dispatch(x, weight, residual)
    return residual + F.linear(x, weight)


@_small_m_linear_add_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def small_m_linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x W^T with the add in the projection's store where `small_m_linear` runs Triton (a
    layer's last residual add, one kernel less per layer at verify); the same bits as the separate add."""
    if not eligible(x, weight):
        return residual + F.linear(x, weight)
    _check_residual(x, weight, residual)
    if torch.compiler.is_compiling():
        return torch.ops.ready_kernels.small_m_linear_add(x, weight, residual)
    return _dispatch(x, weight, residual)
