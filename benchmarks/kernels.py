"""Benchmark the fused kernels against their torch references on a CUDA GPU; prints JSON.

    python -m benchmarks.kernels --json                  # paper and tiny sizes, JSON on stdout
    python -m benchmarks.kernels --json --out b.json     # also write it to a file
    python -m benchmarks.kernels --smoke                 # CPU: run every case once (Triton interpreter), no timing

It times the kernels of `kernels/`, the import package `ready_kernels` of the installed project
(pyproject.toml maps it; `pip install -e .` first).

For each op and size it reports, in µs per call: our Triton kernel and the torch reference,
each eager and under a CUDA graph, and the bound = bytes the op must touch / 4.8e12 B/s (H200
HBM3e). `graph_us` is the per-call time inside one graph of `--calls` calls on rotating inputs
(states come from HBM, not L2, as they would in a decode step); `graph_single_us` is one graph
holding a single call, replayed back to back; `eager_us` is a Python loop over the same calls.
`launch_floor_us` is one tiny kernel per call inside a graph. `--ops` picks some of the ops
(reader, verify, gdn_fused, commit, rmsnorm). A faster kernel here is a lead, not a result: the
phased GDN front won here and lost inside the verify graph (docs/kernels.md), so check a change
with `python -m benchmarks.ab` before believing it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

# `python -m benchmarks.kernels --smoke` or `ready bench kernels --smoke`: before triton is imported
if "--smoke" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ready.cuda_graph import capture  # noqa: E402

from ready_kernels import gdn_fused as gf  # noqa: E402
from ready_kernels import gdn_verify as gv  # noqa: E402
from ready_kernels import rmsnorm as rn  # noqa: E402
from ready_kernels import state_reader as sr  # noqa: E402
from ready.config import entry_point  # noqa: E402

HBM_BYTES_PER_S = 4.8e12

# reader: source layers Ls, value heads H, d_k = d_v = d, rank r, block P, cache GDN layers L
# verify: T = K + 1 tokens, nk key heads (the fused verify); commit: all GDN layers of the model; rmsnorm: hidden size, rows
SIZES = {
    "paper": dict(Ls=2, H=48, nk=16, d=128, r=8, P=7, L=48, T=8, hidden=5120),
    "tiny": dict(Ls=2, H=4, nk=2, d=64, r=8, P=7, L=6, T=8, hidden=256),
}


OPS = ("reader", "verify", "gdn_fused", "commit", "rmsnorm")


class Timer:
    """Per-call µs of a list of closures: eager loop, one graph of all, one graph of one (CUDA)."""

    def __init__(self, reps: int, smoke: bool):
        self.reps, self.smoke = reps, smoke

    def _elapsed_us(self, run: Callable[[], None], n_calls: int) -> float:
        if self.smoke:
            t0 = time.perf_counter()
            run()
            return (time.perf_counter() - t0) * 1e6 / n_calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(self.reps):
            run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / (self.reps * n_calls)

    def _graph(self, fns: list[Callable[[], object]]):
        return capture(lambda: [f() for f in fns], 1, "kernel timing", fallback=False)[0]

    def measure(self, fns: list[Callable[[], object]]) -> dict[str, float]:
        for f in fns:  # warm-up: compile, autotune caches, allocator
            f()

        def eager():
            for f in fns:
                f()

        out = {"eager_us": self._elapsed_us(eager, len(fns))}
        if not self.smoke:
            g_all, g_one = self._graph(fns), self._graph(fns[:1])
            out["graph_us"] = self._elapsed_us(g_all.replay, len(fns))
            out["graph_single_us"] = self._elapsed_us(g_one.replay, 1)
        return {k: round(v, 3) for k, v in out.items()}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(((a - b).norm() / b.norm().clamp_min(1e-30)).item())


def record(op: str, size: str, shape: dict, nbytes: int, ours: dict, ref: dict, err: float, **extra) -> dict:
    bound = nbytes / HBM_BYTES_PER_S * 1e6
    rec = {"op": op, "size": size, "shape": shape, "bytes": nbytes, "bound_us": round(bound, 4),
           "triton": ours, "torch": ref, "rel_err_vs_reference": err, **extra}
    if "graph_us" in ours:
        rec["ratio_to_bound"] = round(ours["graph_us"] / bound, 2)
        rec["speedup_vs_torch_graph"] = round(ref["graph_us"] / ours["graph_us"], 2)
    return rec


def bench_reader(size: str, s: dict, state_dtype: torch.dtype, timer: Timer, calls: int, dev: str,
                 sweep: bool) -> dict:
    Ls, H, d, r, P = s["Ls"], s["H"], s["d"], s["r"], s["P"]
    M, L = Ls * H, max(4, Ls * 2)
    slots_n = calls  # one cache row per call: every call reads states no other call has touched
    ssm = torch.randn(L, slots_n, H, d, d, device=dev).to(state_dtype)
    layer_idx = torch.tensor([1, L - 1][:Ls] if Ls <= 2 else list(range(Ls)), device=dev)
    slots = [torch.tensor([i], device=dev) for i in range(slots_n)]
    z = torch.randn(1, P, M, r, device=dev)
    U = torch.randn(M, r, d, device=dev) / d**0.5
    V = torch.randn(M, d, r, device=dev) / d**0.5
    outs = [torch.empty(1, P, M * r + M, device=dev) for _ in range(calls)]
    err = rel_err(sr.state_reader_triton(ssm, layer_idx, slots[0], z, U, V),
                  sr.state_reader_reference(ssm, layer_idx, slots[0], z, U, V))
    ours = timer.measure([lambda i=i: sr.state_reader_triton(ssm, layer_idx, slots[i], z, U, V, out=outs[i])
                          for i in range(calls)])
    ref = timer.measure([lambda i=i: sr.state_reader_reference(ssm, layer_idx, slots[i], z, U, V)
                         for i in range(calls)])
    nbytes = M * d * d * ssm.element_size() + 2 * M * r * d * 4 + z.numel() * 4 + outs[0].numel() * 4
    extra = {}
    if sweep and not timer.smoke:
        extra["sweep"] = []
        precisions = ["ieee", "tf32", "tf32x3"] + (["tf32x2"] if state_dtype != torch.float32 else [])
        configs = [(128, w, p) for w in (4, 8) for p in precisions] + [(64, 8, p) for p in precisions]
        for bk, w, prec in configs:
            kw = dict(block_k=bk, num_warps=w, precision=prec)
            t = timer.measure([lambda i=i: sr.state_reader_triton(ssm, layer_idx, slots[i], z, U, V, out=outs[i], **kw)
                               for i in range(calls)])
            e = rel_err(sr.state_reader_triton(ssm, layer_idx, slots[0], z, U, V, **kw),
                        sr.state_reader_reference(ssm, layer_idx, slots[0], z, U, V))
            extra["sweep"].append({**kw, "graph_us": t["graph_us"], "rel_err": e})
    shape = dict(B=1, P=P, Ls=Ls, H=H, d_k=d, d_v=d, r=r, state_dtype=str(state_dtype).replace("torch.", ""))
    return record("state_reader", size, shape, nbytes, ours, ref, err, **extra)


def bench_verify(size: str, s: dict, dtype: torch.dtype, timer: Timer, calls: int, dev: str, sweep: bool) -> dict:
    H, d, T = s["H"], s["d"], s["T"]
    n_in = min(calls, 4)
    ins = []
    for _ in range(n_in):
        q = F.normalize(torch.randn(1, T, H, d, device=dev), dim=-1).to(dtype)
        k = F.normalize(torch.randn(1, T, H, d, device=dev), dim=-1).to(dtype)
        v = torch.randn(1, T, H, d, device=dev).to(dtype)
        g = -F.softplus(torch.randn(1, T, H, device=dev))
        beta = torch.sigmoid(torch.randn(1, T, H, device=dev))
        ins.append((q, k, v, g, beta))
    h0 = [torch.randn(1, H, d, d, device=dev) for _ in range(calls)]
    pend = [torch.empty(1, T, H, d, d, device=dev) for _ in range(calls)]
    o1, st1 = gv.gdn_verify_triton(*ins[0], h0[0])
    o2, st2 = gv.gdn_verify_reference(*ins[0], h0[0])
    err = max(rel_err(st1, st2), rel_err(o1, o2))
    ours = timer.measure([lambda i=i: gv.gdn_verify_triton(*ins[i % n_in], h0[i], out_states=pend[i])
                          for i in range(calls)])
    ref = timer.measure([lambda i=i: gv.gdn_verify_reference(*ins[i % n_in], h0[i], out_states=pend[i])
                         for i in range(calls)])
    el = ins[0][0].element_size()
    nbytes = H * d * d * 4 * (1 + T) + T * H * d * (3 * el + el) + 2 * T * H * 4
    extra = {}
    if sweep and not timer.smoke:
        extra["sweep"] = []
        for bv, w in ((16, 2), (16, 4), (8, 1), (8, 2), (32, 4)):
            kw = dict(block_v=bv, num_warps=w)
            t = timer.measure([lambda i=i: gv.gdn_verify_triton(*ins[i % n_in], h0[i], out_states=pend[i], **kw)
                               for i in range(calls)])
            e = rel_err(gv.gdn_verify_triton(*ins[0], h0[0], **kw)[1], st2)
            extra["sweep"].append({**kw, "graph_us": t["graph_us"], "states_rel_err": e})
    shape = dict(B=1, T=T, H=H, d_k=d, d_v=d, qkv_dtype=str(dtype).replace("torch.", ""))
    return record("gdn_verify", size, shape, nbytes, ours, ref, err, **extra)


# the fused verify's launch variants: (block_v, num_warps); the first is the default
GDN_FUSED_SWEEP = ((16, 2), (16, 4), (8, 1), (8, 2), (32, 4))


def bench_gdn_fused(size: str, s: dict, T: int, dtype: torch.dtype, timer: Timer, calls: int, dev: str,
                    sweep: bool) -> dict:
    """The fused verify (conv, norms, gates, recurrence) from raw projections, T tokens."""
    H, nk, d = s["H"], s["nk"], s["d"]
    C, W = 2 * nk * d + H * d, 3
    n_in = min(calls, 4)
    ins = []
    for _ in range(n_in):
        proj = torch.randn(1, T, C + 2 * H, device=dev).to(dtype)
        mixed, b, a = proj.split([C, H, H], dim=-1)
        ins.append((mixed, b, a, torch.randn(1, C, W, device=dev).to(dtype)))
    conv_w = (0.5 * torch.randn(C, W + 1, device=dev)).to(dtype)
    A_log = torch.empty(H, device=dev).uniform_(1.0, 16.0).log()
    dt_bias = torch.randn(H, device=dev)
    h0 = [torch.randn(1, H, d, d, device=dev) for _ in range(calls)]
    pend = [torch.empty(1, T, H, d, d, device=dev) for _ in range(calls)]
    wins = [torch.empty(1, T, C, W, device=dev, dtype=dtype) for _ in range(calls)]

    def call(fn, i, **kw):
        return fn(*ins[i % n_in], conv_w, A_log, dt_bias, h0[i], nk, d, out_states=pend[i], out_windows=wins[i], **kw)

    got = gf.gdn_fused_verify_triton(*ins[0], conv_w, A_log, dt_bias, h0[0], nk, d)
    want = gf.gdn_fused_verify_reference(*ins[0], conv_w, A_log, dt_bias, h0[0], nk, d)
    err = max(rel_err(got[0], want[0]), rel_err(got[1], want[1]))
    ours = timer.measure([lambda i=i: call(gf.gdn_fused_verify_triton, i) for i in range(calls)])
    ref = timer.measure([lambda i=i: call(gf.gdn_fused_verify_reference, i) for i in range(calls)])
    el = ins[0][0].element_size()
    nbytes = H * d * d * 4 * (1 + T) + T * (C + 2 * H) * el + T * C * W * el + T * H * d * 4
    # the engine's mode: each token's replay inputs instead of its state (the commit replays them)
    ins_buf = [torch.empty(1, T, H, gv.input_width(d, d), device=dev) for _ in range(calls)]
    inputs_t = timer.measure([lambda i=i: gf.gdn_fused_verify_triton(*ins[i % n_in], conv_w, A_log, dt_bias, h0[i], nk,
                                                                     d, out_windows=wins[i], out_inputs=ins_buf[i])
                              for i in range(calls)])
    extra = {"engine_mode_replay_inputs": inputs_t}
    if sweep and not timer.smoke:
        extra["sweep"] = []
        for bv, w in GDN_FUSED_SWEEP:
            kw = dict(block_v=bv, num_warps=w)
            t = timer.measure([lambda i=i: call(gf.gdn_fused_verify_triton, i, **kw) for i in range(calls)])
            o = gf.gdn_fused_verify_triton(*ins[0], conv_w, A_log, dt_bias, h0[0], nk, d, **kw)
            # the first token alone through the same variant: does a token's arithmetic depend on T?
            first = gf.gdn_fused_verify_triton(*(x[:, :1] for x in ins[0][:3]), ins[0][3], conv_w, A_log, dt_bias,
                                               h0[0], nk, d, **kw)
            extra["sweep"].append({**kw, "graph_us": t["graph_us"], "states_rel_err": rel_err(o[1], want[1]),
                                   "equal_to_default": all(torch.equal(x, y) for x, y in zip(o, got)),
                                   "token0_equal_to_T1": all(torch.equal(x[:, :1], y) for x, y in zip(o, first))})
    shape = dict(B=1, T=T, H=H, nk=nk, d_k=d, d_v=d, dtype=str(dtype).replace("torch.", ""))
    return record("gdn_fused", size, shape, nbytes, ours, ref, err, **extra)


def bench_commit(size: str, s: dict, timer: Timer, dev: str) -> list[dict]:
    """The commit's replay of 5 accepted tokens onto every GDN layer's live state (one launch)."""
    L, H, d, T = s["L"], s["H"], s["d"], s["T"]
    live = torch.randn(L, 1, H, d, d, device=dev)
    pending = torch.randn(L, 1, T, H, gv.input_width(d, d), device=dev)
    pending[..., :d] = torch.nn.functional.normalize(pending[..., :d], dim=-1)  # k is L2-normalised
    pending[..., 2 * d] = -torch.rand(L, 1, T, H, device=dev)  # log decays < 0
    pending[..., 2 * d + 1] = torch.rand(L, 1, T, H, device=dev)  # beta in (0, 1)
    n = torch.tensor([5], device=dev)
    nbytes = 2 * L * H * d * d * 4 + L * 5 * H * (2 * d + 2) * 4
    shape = dict(L_gdn=L, B=1, T=T, H=H, d_k=d, d_v=d, replayed=5)
    got, want = live.clone(), live.clone()
    gv.gdn_commit_triton(got, pending, n)
    gv.gdn_commit_reference(want, pending, n)
    err = rel_err(got, want)
    ssm = live.clone()  # timed calls replay onto it again and again: the cost, not the value, is measured
    recs = []
    for label, n_arg in (("per_row_tensor_n", n), ("int_n", 5)):
        ours = timer.measure([lambda: gv.gdn_commit_triton(ssm, pending, n_arg)])
        ref = timer.measure([lambda: gv.gdn_commit_reference(ssm, pending, 5)])  # its tensor n syncs: int only
        recs.append(record("gdn_commit", size, {**shape, "n": label}, nbytes, ours, ref, err))
    return recs


def bench_rmsnorm(size: str, s: dict, rows: int, timer: Timer, calls: int, dev: str) -> dict:
    N = s["hidden"]
    xs = [torch.randn(rows, N, device=dev, dtype=torch.bfloat16) for _ in range(calls)]
    w = torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1
    w1 = (1.0 + w.float())
    err = rel_err(rn.rms_norm_triton(xs[0], w), rn.rms_norm_reference(xs[0], w))
    ours = timer.measure([lambda i=i: rn.rms_norm_triton(xs[i], w) for i in range(calls)])
    ref = timer.measure([lambda i=i: rn.rms_norm_reference(xs[i], w) for i in range(calls)])
    fused = timer.measure([lambda i=i: F.rms_norm(xs[i].float(), (N,), w1, 1e-6).to(torch.bfloat16)
                           for i in range(calls)])
    nbytes = 2 * rows * N * 2 + N * 2
    return record("rms_norm", size, dict(rows=rows, hidden=N, dtype="bfloat16"), nbytes, ours, ref, err,
                  torch_fused_rms_norm=fused)


def launch_floor(timer: Timer, calls: int, dev: str) -> dict:
    x = torch.zeros(1, device=dev)
    return timer.measure([lambda: x.add_(1.0) for _ in range(calls)])


@entry_point
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON (the only output format)")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    ap.add_argument("--sizes", default="paper,tiny", help="comma list of: " + ",".join(SIZES))
    ap.add_argument("--calls", type=int, default=16, help="calls per graph (rotating inputs)")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions")
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of: " + ",".join(OPS))
    ap.add_argument("--no-sweep", action="store_true", help="skip the launch-parameter sweeps")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the code paths (interpreter, tiny, untimed)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    if args.smoke:
        dev, sizes, calls = "cpu", ["tiny"], 2
        timer = Timer(1, smoke=True)
    else:
        if not torch.cuda.is_available():
            sys.exit("benchmarks.kernels: needs a CUDA device (use --smoke for a CPU check of the code paths)")
        dev, sizes, calls = "cuda", args.sizes.split(","), args.calls
        timer = Timer(args.reps, smoke=False)
    for name in sizes:
        if name not in SIZES:
            sys.exit(f"benchmarks.kernels: unknown size {name!r}; expected one of {sorted(SIZES)}")
    wanted = args.ops.split(",")
    for op in wanted:
        if op not in OPS:
            sys.exit(f"benchmarks.kernels: unknown op {op!r} in --ops; expected some of {','.join(OPS)}")
    import triton

    result = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter smoke run)",
        "torch": torch.__version__, "triton": triton.__version__, "hbm_bytes_per_s": HBM_BYTES_PER_S,
        "launch_floor_us": launch_floor(timer, calls, dev), "ops": [],
    }
    for name in sizes:
        s = SIZES[name]
        sweep = name == "paper" and not args.no_sweep
        ops = result["ops"]
        if "reader" in wanted:
            for sd in (torch.float32, torch.bfloat16):
                ops.append(bench_reader(name, s, sd, timer, calls, dev, sweep))
        if "verify" in wanted:
            ops.append(bench_verify(name, s, torch.bfloat16, timer, calls, dev, sweep))
        if "gdn_fused" in wanted:
            for T in (1, s["T"]):
                ops.append(bench_gdn_fused(name, s, T, torch.bfloat16, timer, calls, dev, sweep))
        if "commit" in wanted:
            ops.extend(bench_commit(name, s, timer, dev))
        if "rmsnorm" in wanted:
            for rows in (1, 8):
                ops.append(bench_rmsnorm(name, s, rows, timer, calls, dev))
        print(f"[bench] {name} done", file=sys.stderr, flush=True)
    for r in result["ops"]:  # one-line summary per op on stderr (the JSON stays on stdout)
        t, ref = r["triton"], r["torch"]
        print(f"[bench] {r['op']:<13} {r['size']:<5} {json.dumps(r['shape'], separators=(',', ':'))}: "
              f"triton graph {t.get('graph_us')} eager {t['eager_us']} | torch graph {ref.get('graph_us')} "
              f"eager {ref['eager_us']} | bound {r['bound_us']} | err {r['rel_err_vs_reference']:.2e}",
              file=sys.stderr)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
