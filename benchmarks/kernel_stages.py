"""Where the fused kernels' microseconds go, on a CUDA GPU; prints JSON.

    python -m benchmarks.kernel_stages             # paper sizes, both state dtypes

Times variants that stop early, and plain memory floors, under the same CUDA-graph timing as
benchmarks/kernels.py (`graph_us`, 16 calls on rotating inputs):

- reader stages (one program per state, as `state_reader`): `load` reads the state and its
  sum of squares only; `us` adds W = U S; `wv` adds G = W V; `full` is the whole op;
- verify floor: a kernel with the verify grid that only reads the live state and writes T copies
  (no recurrence), and torch's `fill_` of the same bytes.
The differences between neighbouring stages are the costs docs/figures.md quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from benchmarks.kernels import Timer
from ready.config import entry_point
from ready_kernels import state_reader as sr

STAGES = {"load": 1, "us": 2, "wv": 3, "full": 4}


@triton.jit
def _reader_stage_kernel(ssm_ptr, layer_ptr, slot_ptr, z_ptr, u_ptr, v_ptr, out_ptr, s_l, s_s, s_h, z_b, z_p, z_m,
                         H, M, P, R, DK, DV, eps, inv_sqrt_dk, BP: tl.constexpr, BR: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, TERMS: tl.constexpr, STAGE: tl.constexpr):
    """The reader for d_k = BK, d_v = BV (one block), cut after STAGE (see the module docstring)."""
    pid = tl.program_id(0)
    b = pid // M
    m = pid % M
    offs_r = tl.arange(0, BR)
    offs_v = tl.arange(0, BV)
    offs_p = tl.arange(0, BP)
    mask_r = offs_r < R
    mask_p = offs_p < P
    zt, vt = sr._load_z_and_v(z_ptr, v_ptr, b, m, z_b, z_p, z_m, P, R, DV, BP, BR, BV)
    s_base = sr._pair_state_base(ssm_ptr, layer_ptr, slot_ptr, b, m, H, s_l, s_s, s_h)
    kk = tl.arange(0, BK)
    uc = tl.load(u_ptr + m.to(tl.int64) * R * DK + offs_r[:, None] * DK + kk[None, :], mask=mask_r[:, None], other=0.0)
    s = tl.load(s_base + kk[:, None] * BV + offs_v[None, :]).to(tl.float32)
    rms = tl.sqrt(tl.sum(s * s) / (DK * DV) + eps)
    o_base = out_ptr + b.to(tl.int64) * (M * R + M)
    if STAGE == 1:
        tl.store(o_base + m, rms)
    else:
        w = sr._split_dot(uc, s, TERMS)
        if STAGE == 2:
            tl.store(o_base + m, tl.sum(w) * rms)
        else:
            g = tl.dot(w, vt, input_precision="ieee") * (inv_sqrt_dk / rms)
            if STAGE == 3:
                tl.store(o_base + m, tl.sum(g))
            else:
                u = tl.dot(zt, g, input_precision="ieee")
                tl.store(o_base + offs_p[:, None] * (M * R + M) + m * R + offs_r[None, :], u,
                         mask=mask_p[:, None] & mask_r[None, :])


@triton.jit
def _write_states_kernel(h0_ptr, st_ptr, st_t, T: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         DV: tl.constexpr):
    """The verify grid's memory traffic alone: read S[:, block] once, write it T times."""
    h = tl.program_id(0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    offs = h * BK * DV + offs_k[:, None] * DV + offs_v[None, :]
    s = tl.load(h0_ptr + offs)
    for t in range(T):
        s = s * 0.5
        tl.store(st_ptr + t * st_t + offs, s, cache_modifier=".cs")


def reader_stages(timer: Timer, state_dtype: torch.dtype, calls: int = 16) -> dict[str, float]:
    H, d, r, P, M = 48, 128, 8, 7, 96
    ssm = torch.randn(4, calls, H, d, d, device="cuda").to(state_dtype)
    layer_idx = torch.tensor([1, 3], device="cuda")
    slots = [torch.tensor([i], device="cuda") for i in range(calls)]
    z = torch.randn(1, P, M, r, device="cuda")
    U, V = torch.randn(M, r, d, device="cuda") / d**0.5, torch.randn(M, d, r, device="cuda") / d**0.5
    outs = [torch.empty(1, P, M * r + M, device="cuda") for _ in range(calls)]
    terms = sr.PRECISIONS[sr._default_precision(state_dtype)]
    res = {}
    for name, stage in STAGES.items():
        res[name] = timer.measure([lambda i=i: _reader_stage_kernel[(M,)](
            ssm, layer_idx, slots[i], z, U, V, outs[i], *ssm.stride()[:3], *z.stride()[:3], H, M, P, r, d, d, 1e-6,
            d**-0.5,
            BP=16, BR=16, BK=d, BV=d, TERMS=terms, STAGE=stage, num_warps=8) for i in range(calls)])["graph_us"]
    res["state_reader"] = timer.measure([lambda i=i: sr.state_reader_triton(ssm, layer_idx, slots[i], z, U, V,
                                                                            out=outs[i]) for i in range(calls)])["graph_us"]
    return res


def verify_floor(timer: Timer, calls: int = 16) -> dict[str, float]:
    H, d, T, bv = 48, 128, 8, 16
    h0 = [torch.randn(1, H, d, d, device="cuda") for _ in range(calls)]
    pend = [torch.empty(1, T, H, d, d, device="cuda") for _ in range(calls)]
    return {
        "read_once_write_T_times": timer.measure([lambda i=i: _write_states_kernel[(H, d // bv)](
            h0[i], pend[i], pend[i].stride(1), T=T, BK=d, BV=bv, DV=d, num_warps=2) for i in range(calls)])["graph_us"],
        "torch_fill_of_the_T_states": timer.measure([lambda i=i: pend[i].fill_(1.0) for i in range(calls)])["graph_us"],
    }


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: --help only
    if not torch.cuda.is_available():
        sys.exit("benchmarks.kernel_stages: needs a CUDA device")
    timer = Timer(reps=50, smoke=False)
    result = {"device": torch.cuda.get_device_name(), "unit": "us per call, CUDA graph of 16 calls",
              "reader_fp32_states": reader_stages(timer, torch.float32),
              "reader_bf16_states": reader_stages(timer, torch.bfloat16),
              "verify_T8_floor": verify_floor(timer)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
