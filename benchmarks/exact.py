"""Exact mode on the GPU: are the row-invariant ops invariant, what does exact mode cost, how often
does the fast path flip ties. Prints one JSON object.

    python -m benchmarks.exact --probe --json
        op level, no model: exact_linear (27B projection shapes), row_norm, the GDN verify kernel, and
        (for contrast) the fast tuned linear and cuBLAS: is row i of an M-row call the same bits as
        the 1-row call of row i? Then the tiny target in bf16: verify(8) vs 8 steps, eager and in
        CUDA graphs with compiled layers, fast and exact.
    python -m benchmarks.exact --probe-attention --json
        exact mode's attention at the 27B shapes: bits across static-buffer capacities (279 .. 4096) and
        row counts (8 rows vs 1), for the fixed-order kernel (kernels/exact_attention.py) and the per-row
        SDPA it replaced; error against the float32 reference; µs per call.
    python -m benchmarks.exact --target qwen3_5_27b --cost --flips PROMPTS.jsonl --new-tokens 200 --json \
        drafter.proposals=7
        --cost: per mode, the step and verify(K+1) graph replays (µs, CUDA events), AR decode tok/s
        (Engine.generate), and verify(K+1) vs K+1 steps bit for bit on the target itself;
        --flips: `evaluate` with the n-gram drafter in fast and in exact mode (lossless_exact,
        greedy_valid, tie flips, smallest margin, tau, TPS).

The typed config is the command line: K, the n-gram drafter's proposals per round, is `drafter.proposals` of
`load_config(--target's preset, overrides)` (ready/config.py; a checkpoint directory or no --target: the
defaults'), every `a.b=v` argument parsed and checked as `python -m sweeps.run` does: qwen3_5_27b proposes 6 (the
public DSpark checkpoint's), tiny and the defaults 7. The flag `-k N` that restated it is gone, refused in one line
naming its override, `drafter.proposals=N` (its default was 7). The target is loaded in bfloat16 on CUDA whatever
`target.dtype` and `target.device` say: exact mode is a bf16 GPU question.

Speed is reported, never asserted. Needs CUDA (the probes' CPU counterparts are tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ready.config import ConfigError, entry_point, load_config, replaced_flags
from ready.decode.engine import Engine
from ready.decode.evaluate import evaluate, first_mismatch, run_ar
from ready.decode.ngram import NgramDrafter
from ready.target import PRESETS, GraphedVerify, load_target
from ready.target.layers import commit_gdn

# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"-k": "drafter.proposals"}
# fused 27B projections (N, K) and the LM head
SHAPES_27B = {"gdn_in_proj": (16480, 5120), "attn_qkv": (14336, 5120), "mlp_gate_up": (34816, 5120),
              "mlp_down": (5120, 17408), "out_proj": (5120, 6144), "lm_head": (248320, 5120)}


def _rows_invariant(fn, x: torch.Tensor, max_m: int, ms=None) -> dict[str, Any]:
    """Row i of fn(x[:M]) against fn(x[i:i+1]) for M in `ms` (default 1..max_m): equal bits?"""
    single = [fn(x[i:i + 1]) for i in range(max_m)]
    bad, worst = [], 0.0
    for m in (ms or range(1, max_m + 1)):
        y = fn(x[:m])
        for i in range(m):
            if not torch.equal(y[i:i + 1], single[i]):
                bad.append(m)
                worst = max(worst, float((y[i:i + 1].float() - single[i].float()).abs().max()))
                break
    return {"invariant": not bad, "differs_at_M": sorted(set(bad)), "max_abs_diff": worst}


def probe_ops(max_m: int = 8) -> dict[str, Any]:
    import torch.nn.functional as F

    from ready_kernels import small_m_gemm as sm
    from ready_kernels.gdn_verify import gdn_verify_triton
    from ready_kernels.row_norm import row_norm_triton

    torch.manual_seed(0)
    out: dict[str, Any] = {"linear": {}, "row_norm": {}, "gdn_verify": {}}
    for name, (n, k) in SHAPES_27B.items():
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        x = torch.randn(max_m, k, device="cuda").to(torch.bfloat16)
        r = {"exact_linear": _rows_invariant(lambda a: sm.exact_linear(a, w), x, max_m),
             "exact_config": sm.exact_config(x, w).name(),
             "fast_small_m_linear": _rows_invariant(lambda a: sm.small_m_linear(a, w), x, max_m, [max_m]),
             "cublas_F_linear": _rows_invariant(lambda a: F.linear(a, w), x, max_m)}
        out["linear"][name] = r
        del w
    for d in (5120, 256, 128):
        x = torch.randn(max_m * 48, d, device="cuda").to(torch.bfloat16)
        wt = torch.randn(d, device="cuda").to(torch.bfloat16)
        out["row_norm"][str(d)] = _rows_invariant(lambda a: row_norm_triton(a, wt, 1e-6, 1.0), x, max_m)
    B, H, D, T = 1, 48, 128, 8
    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1) * D**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1)
    v = torch.randn(B, T, H, D, device="cuda")
    g = -torch.rand(B, T, H, device="cuda")
    beta = torch.rand(B, T, H, device="cuda")
    h0 = torch.randn(B, H, D, D, device="cuda")
    o8, s8 = gdn_verify_triton(q, k, v, g, beta, h0, 1.0)
    s, o1, st1 = h0, [], []
    for t in range(T):
        o, st = gdn_verify_triton(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s, 1.0)
        o1.append(o)
        st1.append(st)
        s = st[:, 0].contiguous()
    o1, st1 = torch.cat(o1, 1), torch.cat(st1, 1)
    out["gdn_verify"] = {"outputs_equal": bool(torch.equal(o8, o1)), "states_equal": bool(torch.equal(s8, st1)),
                         "max_abs_diff": float(max((o8 - o1).abs().max(), (s8 - st1).abs().max()))}
    return out


def _replayed(model, c, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GDN states and windows [L, T, ...] (row 0) that commit(n) would install for n = 1..T after a
    verify, read on copies of the live cache (nothing committed)."""
    states, conv = [], []
    for n in range(1, T + 1):
        s, w = c.ssm.clone(), c.conv.clone()
        commit_gdn(s, w, c.pending_inputs, c.pending_conv, n, bool(model.exact), c.pending_states)
        states.append(s[:, 0])
        conv.append(w[:, 0])
    return torch.stack(states, 1), torch.stack(conv, 1)


def verify_vs_steps(model, block: torch.Tensor, prompt: torch.Tensor, graphs: bool, max_len: int,
                    caches=None) -> dict[str, Any]:
    """verify(block) once vs one step per token from the same prefix: logits, GDN states and conv
    windows bit for bit (graphs: replayed CUDA graphs with the compiled layers, as the engine runs).
    `caches`: ((cache, graph) for the block, (cache, graph) for the steps), e.g. two engines' own."""
    T = block.shape[1]

    def fresh(c=None):
        if c is None:
            c = model.new_cache(1, max_len, T)
        else:
            c.reset()
        c.static = graphs
        model.prefill(prompt[None], c)
        return c

    c = fresh(caches[0][0] if caches else None)
    if graphs:
        gv = caches[0][1] if caches else GraphedVerify(model, c, T)
        logits = gv(block).logits[0].clone()
    else:
        logits = model.verify(block, c).logits[0].clone()
    states, conv = _replayed(model, c, T)
    c.pending = 0
    c2 = fresh(caches[1][0] if caches else None)
    g1 = (caches[1][1] if caches else GraphedVerify(model, c2, 1)) if graphs else None
    step_logits, step_states, step_conv = [], [], []
    for i in range(T):
        tok = block[:, i:i + 1]
        out = g1(tok) if graphs else model.verify(tok, c2)
        step_logits.append(out.logits[0, 0].clone())
        model.commit(c2, 1)
        step_states.append(c2.ssm[:, 0].clone())
        step_conv.append(c2.conv[:, 0].clone())
    sl, ss, sc = torch.stack(step_logits), torch.stack(step_states, 1), torch.stack(step_conv, 1)
    return {"logits_equal": bool(torch.equal(logits, sl)), "states_equal": bool(torch.equal(states, ss)),
            "conv_equal": bool(torch.equal(conv, sc)),
            "logits_max_abs_diff": float((logits.float() - sl.float()).abs().max()),
            "argmax_equal": bool(torch.equal(logits.argmax(-1), sl.argmax(-1)))}


@torch.inference_mode()
def probe_target(name: str = "tiny", T: int = 8) -> dict[str, Any]:
    torch.manual_seed(0)
    model = load_target(name, device="cuda", dtype=torch.bfloat16)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (48,), device="cuda")
    block = torch.randint(0, vocab, (1, T), device="cuda")
    out = {}
    for exact in (False, True):
        model.exact = exact
        for graphs in (False, True):
            out[f"{'exact' if exact else 'fast'}_{'graphs_compiled' if graphs else 'eager'}"] = \
                verify_vs_steps(model, block, prompt, graphs, 48 + 64)
    model.exact = False
    return out


def _time_replays(fn, n: int) -> float:
    """Median µs of fn over n calls (CUDA events around each)."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


@torch.inference_mode()
def cost(model, k: int, prompt_len: int, new_tokens: int, iters: int) -> dict[str, Any]:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=g).cuda()
    block = torch.randint(0, vocab, (1, k + 1), generator=g).cuda()
    res: dict[str, Any] = {}
    for exact in (False, True):
        model.exact = exact
        mode = "exact" if exact else "fast"
        r: dict[str, Any] = {}
        t0 = time.perf_counter()
        ar = Engine(model, None)
        ar.reserve(prompt_len + new_tokens)
        ar.generate(prompt, new_tokens)  # warm-up: tuning, compile, capture
        r["ar_warmup_s"] = time.perf_counter() - t0
        gens = [ar.generate(prompt, new_tokens) for _ in range(2)]
        r["ar_tok_s"] = [round(len(x.tokens) / x.wall_s, 2) for x in gens]
        t0 = time.perf_counter()
        sp = Engine(model, NgramDrafter(vocab, k))
        sp.reserve(prompt_len + new_tokens)
        sp.generate(prompt, new_tokens)  # warm-up: captures the K+1 graph
        r["spec_warmup_s"] = time.perf_counter() - t0
        gens = [sp.generate(prompt, new_tokens) for _ in range(2)]
        r["ngram_tok_s"] = [round(len(x.tokens) / x.wall_s, 2) for x in gens]
        r["ngram_tau"] = sum(gens[0].committed) / len(gens[0].committed)
        # replays of the engines' own graphs on their own caches (nothing recompiles or recaptures)
        for T, eng in ((1, ar), (k + 1, sp)):
            c, gv = eng.slots.cache, eng.slots.graphs.graphs[T]
            c.reset()
            model.prefill(prompt[None], c)
            ids = block[:, :T]

            def once():
                gv(ids)
                model.commit(c, 1)

            for _ in range(3):
                once()
            r[f"verify{T}_us"] = round(_time_replays(once, min(iters, c.max_len - c.length - T - 1)), 1)
        r["verify_over_step"] = round(r[f"verify{k + 1}_us"] / r["verify1_us"], 4)
        r["verify_vs_steps"] = verify_vs_steps(model, block, prompt, True, 0,
                                               caches=((sp.cache, sp.graphs.graphs[k + 1]), (ar.cache, ar.graphs.graphs[1])))
        del ar, sp
        res[mode] = r
        torch.cuda.empty_cache()
    model.exact = False
    f, e = res["fast"], res["exact"]
    res["exact_cost"] = {
        "step_slowdown_pct": round(100 * (e["verify1_us"] / f["verify1_us"] - 1), 2),
        "verify_slowdown_pct": round(100 * (e[f"verify{k + 1}_us"] / f[f"verify{k + 1}_us"] - 1), 2),
        "ar_tok_s_slowdown_pct": round(100 * (1 - max(e["ar_tok_s"]) / max(f["ar_tok_s"])), 2),
        "ngram_tok_s_slowdown_pct": round(100 * (1 - max(e["ngram_tok_s"]) / max(f["ngram_tok_s"])), 2),
    }
    return res


def _sdpa_rows(q, keys, values, n_keys):
    """The attention exact mode ran before kernels/exact_attention.py, for contrast: one SDPA call per
    query row over the whole buffer, masked to keys 0..n-1."""
    import torch.nn.functional as F

    mask = torch.arange(keys.shape[2], device=q.device)[None, :] < n_keys[:, None]
    return torch.cat([F.scaled_dot_product_attention(q[:, :, i:i + 1].contiguous(), keys, values,
                                                     attn_mask=mask[i:i + 1].contiguous(), enable_gqa=True)
                      for i in range(q.shape[2])], dim=2)


@torch.inference_mode()
def attention_vs_buffer_length(capacities=(279, 286, 294, 512, 1024, 4096), positions=range(60, 279, 7),
                               rows: int = 8, iters: int = 50) -> dict[str, Any]:
    """Exact-mode attention at the 27B shapes (24 query heads, 4 KV heads, head dim 256, bf16): does a
    query row's output depend on the static buffer's capacity (the keys past its position are masked /
    never read), or on how many rows share the call? For the fixed-order kernel exact mode runs
    (`exact_attention_triton`) and, for contrast, the per-row SDPA it replaced. Also: its error against
    the float32 reference, and µs per call (CUDA events, median) for 1 and `rows` rows at the smallest
    capacity."""
    from ready_kernels.exact_attention import exact_attention_reference, exact_attention_triton

    torch.manual_seed(0)
    L0 = max(capacities)
    q = torch.randn(1, 24, rows, 256, device="cuda").to(torch.bfloat16)
    keys = torch.randn(1, 4, L0, 256, device="cuda").to(torch.bfloat16)
    values = torch.randn(1, 4, L0, 256, device="cuda").to(torch.bfloat16)
    bufs = {L: (keys[:, :, :L].contiguous(), values[:, :, :L].contiguous()) for L in capacities}
    out: dict[str, Any] = {"capacities": list(capacities), "positions_checked": len(list(positions))}
    for name, fn in (("exact_attention_triton", exact_attention_triton), ("sdpa_per_row_before", _sdpa_rows)):
        cap_differ, row_differ, worst = [], [], 0.0
        for p in positions:
            n1 = torch.tensor([p + 1], device="cuda")
            outs = [fn(q[:, :, :1], k, v, n1) for k, v in bufs.values()]
            if not all(torch.equal(outs[0], o) for o in outs[1:]):
                cap_differ.append(p)
                worst = max(worst, max(float((outs[0].float() - o.float()).abs().max()) for o in outs[1:]))
        for p in positions:  # a verify block at positions p..p+rows-1 vs its rows one at a time
            k, v = bufs[min(capacities)] if p + rows <= min(capacities) else bufs[L0]
            n = torch.arange(p + 1, p + rows + 1, device="cuda")
            full = fn(q, k, v, n)
            if not all(torch.equal(full[:, :, i:i + 1], fn(q[:, :, i:i + 1], k, v, n[i:i + 1])) for i in range(rows)):
                row_differ.append(p)
        k, v = bufs[min(capacities)]
        n = torch.arange(min(capacities) - rows + 1, min(capacities) + 1, device="cuda")
        timing = {f"us_rows{m}": round(_time_replays(lambda m=m: fn(q[:, :, :m], k, v, n[-m:]), iters), 1)
                  for m in (1, rows)}
        ref = exact_attention_reference(q.float(), k.float(), v.float(), n)
        out[name] = {"positions_that_differ_across_capacity": cap_differ, "max_abs_diff_across_capacity": worst,
                     "positions_where_rows_differ_from_1_row_calls": row_differ,
                     "max_abs_err_vs_fp32_reference": float((fn(q, k, v, n).float() - ref).abs().max()), **timing}
    return out


def flips(model, prompts: list[list[int]], new_tokens: int, k: int, modes=("fast", "exact")) -> dict[str, Any]:
    out = {}
    for mode in modes:
        exact = mode == "exact"
        t0 = time.perf_counter()
        ar = run_ar(model, prompts, new_tokens, progress=False, exact=exact)
        res = evaluate(model, NgramDrafter(model.config.vocab_size, k), prompts, new_tokens, benchmark="flips",
                       method="ngram", progress=False, exact=exact, ar=ar)
        firsts = [first_mismatch(a.tokens, p.tokens) for a, p in zip(ar, res.prompts)]
        out[mode] = {"first_divergence": [None if f is None else f[0] for f in firsts],
            **res.validity(), "prompts": len(prompts), "new_tokens": res.metrics.new_tokens,
            "prompts_identical": sum(p.lossless_exact for p in res.prompts),
            "tau": res.metrics.tau, "tps": res.metrics.tps, "ar_tps": res.ar.tps,
            "mismatch": None if res.mismatch is None else vars(res.mismatch),
            "per_prompt_flips": [p.tie_flips for p in res.prompts],
            "per_prompt_min_margin": [p.min_margin for p in res.prompts],
            "per_prompt_noise_floor": [p.noise_floor for p in res.prompts], "wall_s": time.perf_counter() - t0}
    model.exact = False
    return out


@entry_point
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.exact", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="overrides of the typed config (ready/config.py), e.g. drafter.proposals=7 (the n-gram's K)")
    p.add_argument("--probe", action="store_true", help="op-level and tiny-target invariance probes")
    p.add_argument("--target", help="preset for --cost / --flips (e.g. qwen3_5_27b)")
    p.add_argument("--cost", action="store_true")
    p.add_argument("--flips", help="JSONL prompts (prompt_ids) for the fast vs exact evaluation")
    p.add_argument("--limit", type=int, default=8, help="prompts used from --flips")
    p.add_argument("--new-tokens", type=int, default=200)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--modes", default="fast,exact", help="--flips modes, comma-separated")
    p.add_argument("--probe-attention", action="store_true",
                   help="exact-mode attention (and the per-row SDPA it replaced) vs buffer capacity and row count")
    p.add_argument("--json", action="store_true")
    try:
        replaced_flags(argv, REPLACED)
        args = p.parse_intermixed_args(argv)
        cfg = load_config(preset=args.target if args.target in PRESETS else None, overrides=args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    k = int(cfg.drafter.proposals)  # the n-gram drafter's K
    if not torch.cuda.is_available():
        print("benchmarks.exact needs CUDA", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.probe_attention:
        report["attention_vs_buffer_length"] = attention_vs_buffer_length()
        print(json.dumps(report), flush=True)
    if args.probe:
        t0 = time.perf_counter()
        report["ops"] = probe_ops()
        report["tiny_target"] = probe_target("tiny")
        report["probe_s"] = time.perf_counter() - t0
        print(json.dumps(report), flush=True)
    if args.target:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        model = load_target(args.target, device="cuda", dtype=torch.bfloat16)
        report["target"], report["load_s"] = args.target, time.perf_counter() - t0
        if args.cost:
            report["cost"] = cost(model, k, args.prompt_len, args.new_tokens, args.iters)
            print(json.dumps(report), flush=True)
        if args.flips:
            rows = [json.loads(x) for x in Path(args.flips).read_text().splitlines() if x.strip()][: args.limit]
            prompts = [r["prompt_ids"] if isinstance(r, dict) else r for r in rows]
            report["flips"] = flips(model, prompts, args.new_tokens, k, tuple(args.modes.split(",")))
        from ready_kernels import small_m_gemm as sm

        report["exact_configs"] = {f"{n}x{kk}": c.name() for (n, kk, _, _), c in sm.EXACT_CHOICE.items()}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
