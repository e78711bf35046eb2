"""Benchmark the small-M linear against cuBLAS (F.linear) at the 27B target's projection shapes; prints JSON.

Run from the repository root on a CUDA machine:

    python -m benchmarks.small_m --json [--out docs/data/small_m_h200.json]

For each weight shape (N, K) of the fused target (GDN in_proj, attention qkv, MLP gate_up, down,
out/o projection, LM head) and each row count M, it times F.linear and every Triton configuration
of `small_m_gemm.CONFIGS` (the tuner's timer: `device_timer`, weights cold via `cold_weights`), and reports
µs, the weight-read rate (GB/s = N*K*2 bytes / time) and the winner. `--smoke` runs the tuner on
tiny shapes on CPU (Triton interpreter) without timing meaning anything. `--grid` times a wider
product grid of multi-row configurations (BN x BK x SPLIT x warps x stages) instead of CONFIGS, to
look for candidates worth adding; `--shapes` picks shapes by name.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

# `python -m benchmarks.small_m --smoke` or `ready bench small_m --smoke`: before triton is imported
if "--smoke" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import ready.fastops  # noqa: E402,F401
from ready_kernels import small_m_gemm as sm  # noqa: E402
from ready.config import entry_point  # noqa: E402

# hidden 5120: GDN in_proj (qkv 10240 + z 6144 + b 48 + a 48), attention qkv (q+gate 12288, k 1024, v 1024),
# MLP gate_up (2 x 17408), MLP down, GDN out_proj / attention o_proj (6144 -> 5120), LM head (vocab 248320)
SHAPES_27B = {"gdn_in_proj": (16480, 5120), "attn_qkv": (14336, 5120), "mlp_gate_up": (34816, 5120),
              "mlp_down": (5120, 17408), "out_proj": (5120, 6144), "lm_head": (248320, 5120)}
# how many of each a decode step streams (48 GDN + 16 attention layers)
PER_STEP = {"gdn_in_proj": 48, "attn_qkv": 16, "mlp_gate_up": 64, "mlp_down": 64, "out_proj": 64, "lm_head": 1}


def grid_configs() -> tuple[sm.Config, ...]:
    """Multi-row (tl.dot) configurations over a product grid; shared-memory-hungry ones that a device
    cannot launch are skipped by the tuner's correctness pass."""
    out = []
    for bn, bk, split, warps, stages in itertools.product((16, 32, 64, 128), (256, 512, 1024), (1, 2, 4, 8), (4, 8),
                                                          (3, 4)):
        if (bn + 16) * bk * 2 * stages > 200 * 1024:  # W and x tiles per stage beyond an H200 SM's 227 KB
            continue
        out.append(sm.Config(bn, bk, split, warps, stages))
    return tuple(out)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1,2,4,7,8", help="comma list of row counts")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--grid", action="store_true", help="time grid_configs() instead of small_m_gemm.CONFIGS")
    ap.add_argument("--shapes", default=None, help=f"comma list of shape names ({', '.join(SHAPES_27B)})")
    a = ap.parse_args(argv)
    ms = [int(m) for m in a.m.split(",")]
    smoke = a.smoke or not torch.cuda.is_available()
    dev = "cpu" if smoke else "cuda"
    shapes = {"small": (48, 64)} if smoke else SHAPES_27B
    if a.shapes and not smoke:
        unknown = sorted(set(a.shapes.split(",")) - set(SHAPES_27B))
        if unknown:
            raise SystemExit(f"benchmarks.small_m: unknown --shapes {unknown}; expected names from {sorted(SHAPES_27B)}")
        shapes = {n: SHAPES_27B[n] for n in a.shapes.split(",")}
    timer = (lambda fn: (fn(), 1.0)[1]) if smoke else None
    configs = grid_configs() if a.grid else sm.CONFIGS
    tuner = sm.SmallMTuner(configs=configs[:2] if smoke else configs, timer=timer)
    rows, step_us = [], {m: {"torch": 0.0, "best": 0.0} for m in ms}
    for name, (n, k) in shapes.items():
        w = (torch.randn(n, k, device=dev) / k**0.5).to(torch.float32 if smoke else torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=w.dtype)
            tuner.tune(x, w)
            t = tuner.timings[tuner.key(x, w)]
            best = min(t, key=t.get)
            gbps = {c: round(n * k * w.element_size() / (ms_ * 1e-3) / 1e9, 1) for c, ms_ in t.items()}
            rows.append({"shape": name, "N": n, "K": k, "M": m, "torch_us": round(t["torch"] * 1e3, 2),
                         "best": best, "best_us": round(t[best] * 1e3, 2), "torch_GBps": gbps["torch"],
                         "best_GBps": gbps[best],
                         "all_us": dict(sorted(((c, round(v * 1e3, 2)) for c, v in t.items()), key=lambda kv: kv[1]))})
            if name in PER_STEP:
                step_us[m]["torch"] += PER_STEP[name] * t["torch"] * 1e3
                step_us[m]["best"] += PER_STEP[name] * t[best] * 1e3
    out = {"device": torch.cuda.get_device_name() if not smoke else "cpu (interpreter smoke)",
           "rows": rows, "projection_ms_per_step": {m: {k: round(v / 1e3, 3) for k, v in d.items()}
                                                    for m, d in step_us.items()} if not smoke else None}
    text = json.dumps(out, indent=None if a.json else 2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    if not a.json and not smoke:
        for r in rows:
            print(f"{r['shape']:12s} M={r['M']}  torch {r['torch_us']:8.1f} us {r['torch_GBps']:7.0f} GB/s   "
                  f"best {r['best']:22s} {r['best_us']:8.1f} us {r['best_GBps']:7.0f} GB/s")


if __name__ == "__main__":
    main()
