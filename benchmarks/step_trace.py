"""Where one graphed decode step's time goes: kernels, the gaps between them, per kernel name.

    python -m benchmarks.step_trace --target qwen3_5_27b --json
    python -m benchmarks.step_trace --target qwen3_5_27b --tokens 1,8 --batch 32 --json
    python -m benchmarks.step_trace --target qwen3_5_27b --prefill 1024,8192 --replays 3 --json
    python -m benchmarks.step_trace --draft dspark --batch 1,32 --replays 10 drafter.proposals=7

Replays the captured verify graph of `--tokens` tokens (1 = the AR step; no commit between
replays, so every replay sees the same context) and reports:
- `replay_ms`: ms per replay timed with CUDA events around `--replays` back-to-back replays;
- from a torch.profiler trace of as many replays: `span_ms` (first kernel start to last kernel end,
  per replay), `busy_ms` (sum of kernel durations), `gap_ms` (time between consecutive kernels of
  a replay with no kernel running), `kernels` per replay, and per kernel name its µs, calls, the
  gaps before it and `advance_us`, what it adds to the timeline when kernels overlap under
  programmatic dependent launch (`by_kernel`, largest advance + gap first), and the same summed per
  part of the step (`by_part`: projections, norms and rotary, attention, GDN, state reader, argmax,
  copies and indexing, elementwise; `kernel_part` names each kernel's part).
The profiler itself may lengthen gaps a little: compare `span_ms` with `replay_ms`. CUDA only.

`--batch 1,32` traces each verify at each batch size: above 1 the batched engine's pass (B rows of
`--prompt-len` committed tokens in one ragged cache, `ready.target.ragged`), each step with `bound_ms`
and `over_bound`: its replay against max(bytes it must stream at `--bandwidth`, FLOPs at `--peak-flops`;
`benchmarks.engine.verify_bound`, the yardstick of the batched table), so a missed goal reads off the
same trace that says where its time goes.

`--prefill 1024,8192` traces a batch-1 prefill of each prompt length instead (eager, as the engine admits a
sequence), each against its FLOP bound (2 x the layers' matmul parameters x tokens at `--peak-flops`, plus the
LM head at the last position; attention not counted).

`--tokens 1,8` traces each size on one loaded target and adds `difference`: per kernel name the
µs and calls of the last size minus the first, largest change first, so where verify(8)'s extra
time goes reads off one list (a kernel the sizes dispatch differently shows as one row down and
another up).

`--draft dspark|ready --batch 1,32` traces the drafter's graphed draft step instead (the paper-size,
public-DSpark-shaped drafter of `benchmarks.engine`, random weights), for B rows at each batch size
(B = 1: the single-sequence step; above: the engine's batched step, `ready.decode.batch_draft`), after
a short decode has captured it; `bound_ms` is the time to stream the drafter's weights and the LM head
(every position's logits need every row) at `--bandwidth`, the goal's yardstick (issue 46 item 2).
`--ops` adds `by_op`: the step's body run once eagerly (the same kernels as the graph, launched one by
one) under torch.profiler, its device time per torch op and input shapes, so a kernel of the graphed
trace (names only) is traced back to the line of code whose op launched it.

The typed config is the command line: `load_config(preset, overrides)` (ready/config.py) of the target's preset
(a checkpoint directory: qwen3_5_27b's, the drafter's shape) and every `a.b=v` argument, parsed and checked as
`python -m sweeps.run` does. It gives the target's `target.dtype` (qwen3_5_27b: bfloat16; tiny: float32) and the
traced drafter's K (`drafter.proposals`; qwen3_5_27b: 6, the public DSpark checkpoint's) and its `drafter.*` /
`reader.*` sizes. The flags that restated config keys are gone, each refused in one line naming its override:
`--dtype T` is `target.dtype=T`, `-k N` `drafter.proposals=N` (the flag's default was 7). The target is always on
CUDA (`target.device` is not read).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from collections import defaultdict
from typing import Any, Optional, Sequence

import torch

from benchmarks import copy_rate
from benchmarks.engine import build_drafter, forced_acceptance, measured_bf16_flops, verify_bound
from ready.config import ConfigError, entry_point, load_config, replaced_flags
from ready.decode.engine import Engine
from ready.decode.graphs import GraphRunner
from ready.target import PRESETS, load_target
from ready.target.ragged import new_ragged_cache, prefill_row

# gaps longer than this lie between replays (host launches the next graph), not inside one
REPLAY_BREAK_US = 50.0
# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"-k": "drafter.proposals", "--proposals": "drafter.proposals", "--dtype": "target.dtype"}


def kernel_events(trace: dict, by_grid: bool = False) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of every device kernel in a chrome trace, in start order;
    `by_grid`: the name carries the launch grid, so one kernel's shapes are told apart."""
    def name(e: dict) -> str:
        n = str(e.get("name", "?"))
        grid = (e.get("args") or {}).get("grid")
        return f"{n[:70]} grid={grid}" if by_grid and grid is not None else n

    evs = [(float(e["ts"]), float(e.get("dur", 0.0)), name(e))
           for e in trace.get("traceEvents", []) if e.get("cat") == "kernel" and e.get("ph") == "X"]
    return sorted(evs)


# a kernel's part of the step, by the first pattern its name contains (lower case); the rest is "elementwise"
PARTS = (
    ("projections", ("_small_m_kernel", "_split_sum_kernel", "_gemv_kernel", "_fused_gemv_kernel", "nvjet", "gemm",
                     "cutlass", "xmma")),
    ("norms and rotary", ("_rms_norm_kernel", "_rope_kernel", "_row_norm_kernel")),
    ("attention", ("_attend_kernel", "_combine_kernel", "_exact_attention_kernel", "flash", "fmha", "attention")),
    ("GDN", ("_gdn_", "_window_copy_kernel", "chunk_", "fused_recurrent")),
    ("state reader", ("_state_reader",)),
    ("argmax", ("argmax",)),
    ("copies and indexing", ("copy", "cat", "scatter", "gather", "index", "fill")),
)


def kernel_part(name: str) -> str:
    """The step's part a kernel belongs to (`PARTS`), from its name."""
    low = name.lower()
    return next((part for part, keys in PARTS if any(k in low for k in keys)), "elementwise")


def by_part(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`by_kernel` rows summed per part of the step (`kernel_part`), largest advance + gap first."""
    parts: dict[str, dict[str, float]] = defaultdict(lambda: {"us": 0.0, "advance_us": 0.0, "calls": 0.0,
                                                              "gap_before_us": 0.0})
    for r in rows:
        acc = parts[kernel_part(r["kernel"])]
        for key in acc:
            acc[key] += r[key]
    out = [{"part": k, **{key: round(v, 2) for key, v in acc.items()}} for k, acc in parts.items()]
    return sorted(out, key=lambda r: -(r["advance_us"] + r["gap_before_us"]))


def summarize(events: list[tuple[float, float, str]], replays: int, top: Optional[int] = 25) -> dict[str, Any]:
    """Span, busy and gap time per replay, and per kernel name (the `top` largest; None: all), from
    ordered kernel events.

    With programmatic dependent launch a kernel starts while the one before it still runs, so
    durations overlap and `us` (the sum of durations) overstates what a kernel costs the step.
    `advance_us` is what it adds to the replay's timeline: how far its end moves the latest end so
    far, the idle gap before it excluded. Per replay, advances plus gaps add up to the span; rows are
    ordered by advance plus gap."""
    if not events:
        raise SystemExit("step_trace: the profiler recorded no kernels (is this a CUDA build with CUPTI?)")
    rows: dict[str, dict[str, float]] = defaultdict(
        lambda: {"us": 0.0, "advance_us": 0.0, "calls": 0.0, "gap_before_us": 0.0})
    busy = gap = between = 0.0
    prev_end: Optional[float] = None
    for ts, dur, name in events:
        r = rows[name[:100]]
        r["us"] += dur
        r["calls"] += 1
        busy += dur
        if prev_end is None:
            r["advance_us"] += dur
        else:
            g = max(0.0, ts - prev_end)
            if g > REPLAY_BREAK_US:
                between += g
            else:
                gap += g
                r["gap_before_us"] += g
            r["advance_us"] += max(0.0, ts + dur - max(prev_end, ts))
        prev_end = ts + dur if prev_end is None else max(prev_end, ts + dur)
    span = (prev_end - events[0][0]) - between
    by = sorted(rows.items(), key=lambda kv: -(kv[1]["advance_us"] + kv[1]["gap_before_us"]))
    per = lambda v: round(v / replays, 2)  # noqa: E731
    every = [{"kernel": k, "us": per(v["us"]), "advance_us": per(v["advance_us"]), "calls": per(v["calls"]),
              "gap_before_us": per(v["gap_before_us"])} for k, v in by]
    return {
        "span_ms": round(span / replays / 1e3, 4), "busy_ms": round(busy / replays / 1e3, 4),
        "gap_ms": round(gap / replays / 1e3, 4), "kernels": len(events) / replays,
        "by_part": by_part(every), "by_kernel": every[:top],
    }


def step_replayer(target: Any, tokens: int, prompt_len: int, batch: int = 1) -> Any:
    """A callable that runs the graphed verify of `tokens` tokens once and forgets it (no commit:
    every call sees the same context). `batch` > 1: the batched engine's pass, B rows of `prompt_len`
    committed tokens in one ragged cache (`ready.target.ragged`). Tunes, compiles and captures on its
    first calls."""
    dev = target.device
    runner = GraphRunner(target, [], short_rounds=batch == 1)
    if batch == 1:
        cache = target.new_cache(1, prompt_len + 16 + tokens, max_verify=max(1, tokens))
        runner.prepare(cache)
        target.prefill(torch.randint(0, target.config.vocab_size, (1, prompt_len), device=dev), cache)
    else:
        cache = new_ragged_cache(target, batch, prompt_len + 16 + tokens, max_verify=max(1, tokens))
        runner.prepare(cache)
        for b in range(batch):
            prefill_row(target, cache, b, torch.randint(0, target.config.vocab_size, (prompt_len,), device=dev),
                        last_logits_only=True)
    block = torch.randint(0, target.config.vocab_size, (batch, tokens), device=dev)

    def replay() -> None:
        runner.verify(block, cache)
        cache.pending = 0  # nothing committed: the live state and the KV below each row's length are untouched

    return replay


def prefill_replayer(target: Any, prompt_len: int) -> Any:
    """A callable that prefills one `prompt_len`-token prompt into a cleared cache, as the engine admits a
    sequence (eager: a prefill is never graphed; logits of the last position only)."""
    dev = target.device
    cache = target.new_cache(1, prompt_len + 16)
    prompt = torch.randint(0, target.config.vocab_size, (1, prompt_len), device=dev)

    def replay() -> None:
        cache.reset()
        target.prefill(prompt, cache, last_logits_only=True)

    return replay


def trace_prefill(target_spec: str, dtype: str, lengths: Sequence[int], replays: int, seed: int,
                  peak_flops: float, by_grid: bool = False) -> dict[str, Any]:
    """The trace of a batch-1 prefill at each prompt length on one loaded target, each against its FLOP
    bound at `peak_flops`: 2 x the layers' matmul parameters x tokens, plus the LM head's for the one position
    whose logits a prefill computes (attention's own FLOPs not counted; `benchmarks.train_scale` counts the
    head at every position, 5 % more at the 27B shape)."""
    torch.manual_seed(seed)
    target = load_target(target_spec, device="cuda", dtype=dtype)
    head = target.lm_head.weight.numel()
    tied = target.lm_head.weight is target.embed_tokens.weight  # parameters() yields a tied table once
    params = sum(p.numel() for p in target.parameters()) - head - (0 if tied else target.embed_tokens.weight.numel())
    top = 40 if by_grid else 25
    steps = []
    for n in lengths:
        st = {"prompt_len": n, **trace_replay(prefill_replayer(target, n), replays, by_grid)}
        if peak_flops > 0:
            bound = 2.0 * (params * n + head) / peak_flops * 1e3
            st["bound_ms"], st["over_bound"] = round(bound, 4), round(st["replay_ms"] / bound, 3)
        steps.append({**st, "by_kernel": st["by_kernel"][:top]})
        torch.cuda.empty_cache()
    return {"target": target_spec, "dtype": dtype, "replays": replays, "peak_flops": peak_flops or None,
            "matmul_params": params, "prefill": steps}


def draft_replayer(target: Any, kind: str, preset: str, batch: int, prompt_len: int, proposals: int,
                   seed: int, config: Any = None) -> tuple[Any, Any, Any]:
    """(a callable that replays the drafter's captured draft step for `batch` rows once, the drafter, a
    callable that runs the step's body eagerly, outside the graph: `op_times`);
    the drafter of `config`'s drafter and reader sections (None: `preset`'s) proposing `proposals` tokens.
    A short decode of `batch` prompts (forced acceptance of every draft) tunes, compiles and captures it;
    the engine stays alive with the replayer, so the graph's buffers and cache stay valid. Each replay
    rewrites the same context rows, so every replay sees the same inputs."""
    drafter = build_drafter(target, kind, preset, proposals, seed, config)
    engine = Engine(target, drafter, batch_size=batch, eos_token_id=-1, cuda_graphs=True,
                    accept_fn=forced_acceptance({drafter.proposals: 1.0}, seed))
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen) for _ in range(batch)]
    engine.decode(prompts, 4 * proposals)
    step = getattr(engine.slots, "draft_step", None)  # the batched step (B > 1), else the single-sequence one
    graph = step.graph if step is not None else (drafter._graphs[0].graph if drafter._graphs else None)
    eager = step._body if step is not None and target.device.type != "cuda" else None  # off CUDA (tests)
    if graph is None and eager is None:
        raise SystemExit(f"step_trace: the {kind} drafter's draft step at batch {batch} was not captured in a CUDA graph")
    run = graph.replay if graph is not None else eager
    body = step._body if step is not None else functools.partial(drafter._static_body, drafter._graphs[0])

    def replay() -> None:
        engine  # noqa: B018  (held: the graph reads its cache and buffers)
        run()

    def eager_body() -> None:
        engine  # noqa: B018
        with torch.no_grad():
            body()

    return replay, drafter, eager_body


def draft_stream_bytes(drafter: Any) -> int:
    """Bytes a draft step must stream at least: every drafter weight but embedding tables (a few rows
    read), plus the target's LM head (the drafted positions' logits read every row)."""
    tables = sum(m.weight.nbytes for m in drafter.modules() if isinstance(m, torch.nn.Embedding))
    return sum(p.nbytes for p in drafter.parameters()) - tables + drafter._shared[1].weight.nbytes


def trace_replay(replay: Any, replays: int, by_grid: bool = False) -> dict[str, Any]:
    """Warm `replay` up (tuning, compiling, capturing), then time it with CUDA events and trace it
    with torch.profiler: `replay_ms` and `summarize`'s figures, every kernel row kept."""
    for _ in range(3):
        replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        replay()
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / replays

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    return {"replay_ms": round(replay_ms, 4), **summarize(kernel_events(trace, by_grid), replays, top=None)}


def op_times(body: Any, top: int = 25) -> list[dict[str, Any]]:
    """Device µs per call of `body` (run once eagerly after a warm call) per torch op and input shapes,
    the `top` largest first: the profiler charges each kernel to the op that launched it. The kernels
    keep rows of their own too (input shapes []), so a Triton kernel launched outside any torch op (the
    norms) still shows; an op's row and its kernel's row count the same time twice."""
    from torch.profiler import ProfilerActivity, profile

    body()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        body()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        us = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0))
        if us > 0:
            rows.append({"op": e.key, "shapes": str(e.input_shapes)[:200], "device_us": round(us, 2),
                         "calls": int(e.count)})
    return sorted(rows, key=lambda r: -r["device_us"])[:top]


def kernel_difference(first: dict[str, Any], last: dict[str, Any], top: int = 25) -> list[dict[str, Any]]:
    """Per kernel name, `last` minus `first` in µs and calls per replay (a kernel missing from one
    counts as 0 there), the `top` largest changes in either direction first."""
    a = {r["kernel"]: r for r in first["by_kernel"]}
    b = {r["kernel"]: r for r in last["by_kernel"]}
    zero = {"us": 0.0, "advance_us": 0.0, "calls": 0.0}
    rows = []
    for k in dict.fromkeys([*a, *b]):
        ra, rb = a.get(k, zero), b.get(k, zero)
        adv_a, adv_b = ra.get("advance_us", ra["us"]), rb.get("advance_us", rb["us"])
        rows.append({"kernel": k, "us": round(rb["us"] - ra["us"], 2),
                     "advance_us": round(adv_b - adv_a, 2), "calls": round(rb["calls"] - ra["calls"], 2),
                     "us_first": ra["us"], "us_last": rb["us"]})
    return sorted(rows, key=lambda r: -abs(r["advance_us"]))[:top]


def trace_step(target_spec: str, dtype: str, sizes: list[int], prompt_len: int, replays: int, seed: int,
               by_grid: bool = False, batches: Sequence[int] = (1,), bandwidth: float = 0.0,
               peak_flops: float = 0.0) -> dict[str, Any]:
    """The trace of each verify size at each batch size on one loaded target, each against its bound
    (`benchmarks.engine.verify_bound`: bytes at `bandwidth`, FLOPs at `peak_flops`; 0 leaves that part
    out); one step: its trace alone, several: `steps` (one each) and `difference` (last minus first)."""
    torch.manual_seed(seed)
    target = load_target(target_spec, device="cuda", dtype=dtype)
    streamed = sum(p.nbytes for p in target.parameters()) - target.embed_tokens.weight.nbytes
    top = 40 if by_grid else 25
    steps = []
    for B in batches:
        for t in sizes:
            st = {"batch": B, "tokens": t, **trace_replay(step_replayer(target, t, prompt_len, B), replays, by_grid)}
            bound = verify_bound(target, B, B * t, prompt_len + t, streamed, bandwidth, peak_flops)["bound_ms"]
            if bound:
                st["bound_ms"], st["over_bound"] = round(bound, 4), round(st["replay_ms"] / bound, 3)
            steps.append(st)
            torch.cuda.empty_cache()
    head = {"target": target_spec, "dtype": dtype, "prompt_len": prompt_len, "replays": replays,
            "bandwidth": bandwidth or None, "peak_flops": peak_flops or None}
    cut = [{**st, "by_kernel": st["by_kernel"][:top]} for st in steps]
    if len(steps) == 1:
        return {**head, **cut[0]}
    return {**head, "steps": cut, "difference": kernel_difference(steps[0], steps[-1], top)}


def trace_draft(target_spec: str, dtype: str, kind: str, batches: list[int], prompt_len: int, replays: int,
                seed: int, proposals: int, bandwidth: float, by_grid: bool = False,
                ops: bool = False, config: Any = None) -> dict[str, Any]:
    """The trace of the draft step at each batch size on one loaded target, against its stream bound;
    `ops`: each step's `by_op` too (`op_times`); `config`: the command's config, whose drafter and reader
    sections size the drafter (None: the preset's)."""
    torch.manual_seed(seed)
    target = load_target(target_spec, device="cuda", dtype=dtype)
    preset = target_spec if target_spec in PRESETS else "qwen3_5_27b"
    top = 40 if by_grid else 25
    steps, stream = [], 0
    for B in batches:
        replay, drafter, body = draft_replayer(target, kind, preset, B, prompt_len, proposals, seed, config)
        stream = draft_stream_bytes(drafter)
        st = trace_replay(replay, replays, by_grid)
        steps.append({"batch": B, **st, "over_bound": round(st["replay_ms"] / (stream / bandwidth * 1e3), 3),
                      "by_kernel": st["by_kernel"][:top], **({"by_op": op_times(body, top)} if ops else {})})
        del replay, drafter, body
        torch.cuda.empty_cache()
    return {"target": target_spec, "dtype": dtype, "drafter": kind, "proposals": proposals, "prompt_len": prompt_len,
            "replays": replays, "stream_gb": round(stream / 1e9, 3), "bandwidth": bandwidth,
            "bound_ms": round(stream / bandwidth * 1e3, 4), "steps": steps}


def positive_ints(text: str) -> list[int]:
    """A comma list of integers >= 1 ("1,8"); [] when any part is not one (the caller names its flag)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return []
    return values if values and min(values) >= 1 else []


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.step_trace", description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="overrides of the typed config (ready/config.py), e.g. drafter.proposals=7 target.dtype=bfloat16")
    ap.add_argument("--target", default="qwen3_5_27b", help="preset name or checkpoint directory (the config's "
                    "preset: the target's own, else qwen3_5_27b)")
    ap.add_argument("--tokens", default="1", help="tokens per verify (1 = the AR step); a comma list, e.g. 1,8, "
                    "traces each and their per-kernel difference")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft", choices=("dspark", "ready"), default=None,
                    help="trace this drafter's graphed draft step instead of the verify (see --batch)")
    ap.add_argument("--batch", default="1", help="rows per step, a comma list (e.g. 1,32): the verify's (above 1 the "
                    "batched engine's ragged pass) or, with --draft, the draft step's")
    ap.add_argument("--prefill", default=None, help="trace a batch-1 prefill of these prompt lengths instead "
                    "(a comma list, e.g. 1024,8192), each against its FLOP bound")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s of the bounds (default: the GPU's copy rate, benchmarks.COPY_BYTES_PER_S)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="FLOP/s of the verify's FLOP bound (default: measured, a bf16 matmul on the card)")
    ap.add_argument("--by-grid", action="store_true", help="split each kernel's rows by launch grid (its shapes)")
    ap.add_argument("--ops", action="store_true", help="with --draft: also the device time per torch op and "
                    "input shapes of the step's body run eagerly (`by_op`)")
    ap.add_argument("--json", action="store_true", help="print JSON (the default output)")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    try:
        replaced_flags(argv, REPLACED)
        a = ap.parse_intermixed_args(argv)
        preset = a.target if a.target in PRESETS else "qwen3_5_27b"  # the drafter's shape for a checkpoint
        cfg = load_config(preset=preset, overrides=a.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype, proposals = str(cfg.target.dtype), int(cfg.drafter.proposals)
    if not torch.cuda.is_available():
        print("step_trace: needs a CUDA device (it traces the CUDA-graphed step)", file=sys.stderr)
        return 2
    sizes, batches = positive_ints(a.tokens), positive_ints(a.batch)
    if not sizes or a.replays < 1:
        print(f"step_trace: --tokens must be sizes >= 1 (e.g. 1 or 1,8) and --replays >= 1, got {a.tokens!r} and "
              f"{a.replays}", file=sys.stderr)
        return 2
    if not batches:
        print(f"step_trace: --batch must be sizes >= 1 (e.g. 1,32), got {a.batch!r}", file=sys.stderr)
        return 2
    lengths = None if a.prefill is None else positive_ints(a.prefill)
    if lengths == []:
        print(f"step_trace: --prefill must be prompt lengths >= 1 (e.g. 1024,8192), got {a.prefill!r}", file=sys.stderr)
        return 2
    if a.draft is not None and lengths is None:
        bandwidth = a.bandwidth or copy_rate("cuda")
        if bandwidth <= 0:
            print(f"step_trace: no copy rate known for {torch.cuda.get_device_name()}; pass --bandwidth BYTES_PER_S",
                  file=sys.stderr)
            return 2
        out = trace_draft(a.target, dtype, a.draft, batches, a.prompt_len, a.replays, a.seed, proposals,
                          bandwidth, a.by_grid, a.ops, cfg)
    else:
        peak = a.peak_flops if a.peak_flops is not None else measured_bf16_flops(torch.device("cuda"))
        if lengths is not None:
            out = trace_prefill(a.target, dtype, lengths, a.replays, a.seed, peak, a.by_grid)
        else:
            out = trace_step(a.target, dtype, sizes, a.prompt_len, a.replays, a.seed, a.by_grid, batches,
                             a.bandwidth or copy_rate("cuda"), peak)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
