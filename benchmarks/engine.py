"""Benchmark the decoding engine: AR tokens/s, verify-vs-step cost, forced-acceptance TPS, and the
DSpark / ReaDy round at paper size.

    python -m benchmarks.engine --target tiny --json target.device=cpu
    python -m benchmarks.engine --target qwen3_5_27b drafter.proposals=7 \
        --accept-dist "0:0.1,3:0.3,7:0.6" --accept-dist "0:0.05,3:0.25,7:0.7" --json
    python -m benchmarks.engine --target qwen3_5_27b --drafter dspark,ready \
        --accept-dist 0:0.15,1:0.1,2:0.1,3:0.1,4:0.1,5:0.15,6:0.3 --breakdown --json
    python -m benchmarks.engine --target qwen3_5_27b --drafter dspark,ready reader.rank=64 \
        --accept-dist 0:0.15,1:0.1,2:0.1,3:0.1,4:0.1,5:0.15,6:0.3 --batch 1,2,4,8,16 --batch-only --json

The typed config is the command line: the benchmark's config is `load_config(preset, overrides)` (ready/config.py)
of the drafter preset (`--drafter-preset`, default the target's preset, else tiny: experiments/presets/) and
every `a.b=v` argument, parsed and checked as `python -m sweeps.run` does (a misspelled key or a bad value is
one line naming it). It gives the target's `target.dtype`, `target.device` (auto: CUDA when visible) and
`target.compile` (torch.compile inside the CUDA graphs; auto = on CUDA), K = `drafter.proposals`, the real
drafters' `drafter.*` and `reader.*` sections, the batched section's sampling (`eval.temperature`,
`eval.top_p`) and verify schedule (`eval.verify_schedule`, `eval.confidence_threshold`, `eval.verify_budget`).
qwen3_5_27b: bfloat16 on CUDA, K = 6 (the public DSpark checkpoint's); tiny: float32, device auto, K = 7. The
flags that restated config keys are gone, each refused in one line naming its override: `-k N` is
`drafter.proposals=N`, `--device D` `target.device=D`, `--dtype T` `target.dtype=T`, `--compile` /
`--no-compile` `target.compile=on` / `off`, `--temperature T` `eval.temperature=T`, `--confidence-threshold X`
`eval.confidence_threshold=X`, `--verify-budget X` `eval.verify_budget=X`. The rest (`--target`, what to time
and how often) are the benchmark's own flags.

Prints one JSON object (stdout, or --out); on stderr one `[bench N s]` line per finished section, so
a run cut by a time limit still shows what it measured. Its keys:
- `ar`: greedy AR through the engine (CUDA graphs on CUDA); `tokens_per_s` follows
  `ready.metrics` (clock from prefill to the last token); `decode_tokens_per_s` and
  `step_ms` leave the prefill out.
- `verify`: the cost of one round's target work, verify of t tokens + commit, for t = 1 (an
  AR step), 2, 4 and K+1, at a fixed context; `ratio` = verify(K+1) / step.
- `forced`: for each `--accept-dist A:p,...`, the engine runs real verify/commit rounds but
  the accepted length of each round is drawn from that distribution instead of compared
  (drafts are random tokens and cost nothing, so this is engine-limited TPS of a drafter
  with that acceptance; the output is of course not lossless). `ideal_speedup` =
  tau * step_ms / verify_ms is what a zero-overhead engine would reach; `engine_efficiency`
  = measured decode speedup / ideal.
- `bound`: weight bytes streamed per step / memory bandwidth (given by --bandwidth; default the GPU's
  measured copy rate, `benchmarks.COPY_BYTES_PER_S`: 4.27e12 B/s on an H200, 3.0e12 on an H100; none on
  CPU or another GPU); `step_ms_with_kv` adds the K/V bytes the full-attention layers read at the decode's
  mean context (prompt + new tokens / 2).
- `--prompt-len 1024,8192,32768`: every section at each length in turn, one loaded target:
  `{"prompt_lens": [...], "by_prompt_len": [the result at each length]}`.
- `drafters` (`--drafter dspark,ready`): real DSpark drafters with random weights (the config's `drafter`
  and `reader` sections: the preset's sizes, e.g. qwen3_5_27b: 5 layers, 6 proposals, and any `drafter.*` /
  `reader.*` override; ReaDy adds the reader, r = 8 on layers 30 and 62, once, post-attention, last layer). Each
  accept distribution drives both with the same sequence of accepted lengths (forced acceptance,
  reseeded for every generation), so their rounds are identical and `ready_over_dspark` (ReaDy TPS /
  DSpark TPS) is the pure cost of reading states. Both engines are warmed up alike, then `--pairs`
  generations of each run in ABBA order (a drift or an order effect inside a pair hits both alike);
  `ready_over_dspark_interval` is the geometric mean of the pairs' ratios with its 95 % t-interval and
  the order effect (ratio when DSpark ran first over when it ran second). `--breakdown` times as many
  pairs again with CUDA events around draft, verify and commit (per-round medians; `other` = the rest
  of a round; `events_over_plain` = what the events cost), gives the ratio of their round sums
  (`breakdown_ratio`), and checks the two agree (`consistency`): where the 99 % interval of their
  difference excludes 0 and the difference exceeds `--tolerance-pct`, the command exits 3 (the timing
  is biased). `ready_over_dspark_median_round`: DSpark's median round over ReaDy's, paired the same
  way; whole generations vary by several % with a few long rounds (`tail_us`: their time past 1.5 ×
  the median round; `last_round_us`: the budget-cut last round), the median round does not, so this
  is the figure that resolves a reader's cost of a fraction of a %; `ready_minus_dspark_us`: ReaDy's extra
  µs per median round, part by part (round, draft, verify, commit, other), with paired t-intervals. `reader` gives the readers' own µs per draft step (a CUDA graph of repeated
  calls) and the draft-time difference.
- `first_vs_later` (`--first-later`): before anything else in the process, two engines with the
  ReaDy drafter, each warmed up as `ready.decode.evaluate` does (reserve + one generation), then timed.
- `profile` (`--profile`): the top device kernels of a few DSpark and ReaDy rounds (torch.profiler)
  and the kernels whose time differs most between them.
- `small_m`: the shapes the small-M linear tuned and what each picked (CUDA); `fused_gemv`: the same
  for the AR step's fused projections (kernels/fused_gemv.py).
- `source`: the source tree whose `ready` and `ready_kernels` ran (`benchmarks.ab --tree` A/Bs trees).
- `batched` (`--batch 1,2,4,8,16`): AR, DSpark and ReaDy (the `--drafter` kinds, paper-size drafters as
  above, forced acceptance from the first `--accept-dist`, reseeded per call so both drafters run identical
  rounds) through `ready.decode.engine.Engine` with B slots at each batch size: `--waves` x B prompts per timed call,
  `tokens_per_s` = all new tokens / wall time, `decode_tokens_per_s` without the prefills, per-round µs of
  draft / verify / commit, `reader_share` = (ReaDy draft µs - DSpark draft µs) / ReaDy round µs,
  `ready_over_dspark`, `reader` (the readers' own µs at that batch, CUDA) and `reader_share_direct` =
  those µs / ReaDy round µs. CUDA graphs per batch size
  (verify per block length, the batched draft step). `--batch-only` skips the single-sequence sections.
  `--slots ragged` decodes B = 1 through the ragged slot store as well (`ready.decode.slots`; by default one
  slot is `SingleSlot`): beside the single-sequence sections, the cost of a batch of one on the ragged path.
  `eval.temperature=T` (> 0): every method samples (one seed per prompt, `eval.top_p`) under the real acceptance
  rule, so with random weights few drafts survive: the figures are the cost of the batched sampling path.
  `--verify-schedule full,confidence` (`ready.decode.schedule`; default the config's `eval.verify_schedule`): each
  drafter runs under each schedule listed, the confidence one (`eval.confidence_threshold`,
  `eval.verify_budget`) as `dspark@confidence`, `ready@confidence`
  (`over_full`: its TPS over the same drafter's under the full schedule). Forced acceptance needs forced
  confidences (`ForcedRounds`, `--force-confidence`): `calibrated` gives every round the distribution's
  conditional acceptance c_j = P(A >= j) / P(A >= j-1) (a head calibrated on the distribution that knows
  nothing of the round: the threshold cuts every round at the same place and A is capped there), `oracle`
  draws the round's A first and gives c_j = 1 for j <= A, 0 after (the threshold verifies exactly the
  drafts that will be accepted: τ unchanged, the shortest verify; the bound of what a schedule saves).
  Each method reports `verified_per_round` (per row: drafts its schedule verified + the anchor) and
  `verify_tokens_per_round` (what the pass ran over: slots x the longest scheduled row's width), and
  `verify_bound` / `verify_over_bound`: max(bytes it must stream / the copy rate, FLOPs / the measured bf16
  matmul rate (`--peak-flops`)) at that pass's tokens (`verify_bound`), and the breakdown's verify µs over it.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

import ready
import ready.fastops  # noqa: F401  (the kernels' loader, before the tuners are read)
import ready_kernels
from benchmarks import copy_rate
from ready.artifacts import atomic_write_text
from ready.config import (ConfigError, compile_in_graphs, entry_point, load_config, preset_names,
                          replaced_flags)
from ready.cuda_graph import capture, replay_us
from ready.decode.engine import Engine
from ready.decode.errors import DecodeError
from ready.decode.evaluate import _warm_up
from ready.decode.graphs import GraphRunner
from ready.decode.rounds import Generation
from ready.decode.sampling import SamplingParams
from ready.decode.schedule import SCHEDULES, VerifySchedule
from ready.drafter import DSparkDrafter
from ready.loading import pick_device
from ready.reader import StateSource, read_states
from ready.target import PRESETS, load_target
from reports.stats import mean_interval, t_quantile

DRAFTERS = ("random", "dspark", "ready")
# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"-k": "drafter.proposals", "--proposals": "drafter.proposals", "--device": "target.device",
            "--dtype": "target.dtype", "--compile": "target.compile=on", "--no-compile": "target.compile=off",
            "--temperature": "eval.temperature", "--confidence-threshold": "eval.confidence_threshold",
            "--verify-budget": "eval.verify_budget"}
_T0 = time.monotonic()
TIMELINE: list[tuple[float, str]] = []  # (seconds since start, section): the JSON's `timeline_s`


def progress(msg: str) -> None:
    """One line on stderr per finished section (seconds since start): a run cut by a time limit still
    says what it measured. The JSON stays on stdout / --out, and keeps the same marks as `timeline_s`:
    where a process's minutes go (loading, compiling and capturing, timing) without a profiler."""
    t = time.monotonic() - _T0
    TIMELINE.append((t, msg))
    print(f"[bench {t:6.0f} s] {msg}", file=sys.stderr, flush=True)


def parse_accept_dist(text: str, proposals: int) -> dict[int, float]:
    """'0:0.1,3:0.3,7:0.6' -> {0: 0.1, 3: 0.3, 7: 0.6} (normalised); A must lie in 0..K."""
    dist: dict[int, float] = {}
    try:
        for part in text.split(","):
            a, p = part.split(":")
            dist[int(a)] = dist.get(int(a), 0.0) + float(p)
    except ValueError:
        raise DecodeError(f"--accept-dist {text!r}: expected 'A:p,A:p,...', e.g. 0:0.1,3:0.3,7:0.6") from None
    bad = [a for a in dist if not 0 <= a <= proposals]
    total = sum(dist.values())
    if bad or total <= 0 or any(p < 0 for p in dist.values()):
        raise DecodeError(f"--accept-dist {text!r}: accepted lengths must lie in 0..K={proposals} with "
                          "non-negative probabilities that sum to more than 0")
    return {a: p / total for a, p in sorted(dist.items())}


class RandomDrafter:
    """Proposes random tokens on the target's device (free drafts for engine-limited timing)."""

    def __init__(self, vocab_size: int, proposals: int, device: torch.device, seed: int = 0) -> None:
        self.vocab_size, self.proposals, self.capture_layers = vocab_size, proposals, []
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def propose(self, step: Any) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (1, self.proposals), generator=self.gen, device=self.device)


def forced_acceptance(dist: dict[int, float], seed: int = 0) -> Callable[[torch.Tensor, torch.Tensor], int]:
    """An accept_fn that ignores the comparison and draws A from `dist`."""
    rng = random.Random(seed)
    values, weights = list(dist), list(dist.values())
    return lambda drafts, argmax: rng.choices(values, weights)[0]


FORCED_CONFIDENCE = ("calibrated", "oracle")


def calibrated_confidence(dist: dict[int, float], proposals: int) -> list[float]:
    """The step confidences of a calibrated head that knows the forced distribution but not the round:
    c_j = P(A >= j | A >= j-1) = S_j / S_{j-1}, S_j = P(A >= j) (0 where S_{j-1} = 0)."""
    surv = [sum(p for a, p in dist.items() if a >= j) for j in range(proposals + 1)]
    return [surv[j] / surv[j - 1] if surv[j - 1] > 0 else 0.0 for j in range(1, proposals + 1)]


class ForcedRounds:
    """Forced acceptance with a forced confidence (`Engine(accept_fn=.accept, confidence_fn=.confidence)`):
    a round's accepted length A is drawn from `dist` as `forced_acceptance` draws it, and its confidences are

    - `calibrated`: every round the same `calibrated_confidence` of `dist` (a head calibrated on the
      distribution that knows nothing of the round; the threshold rule then verifies the same prefix every
      round, and A is capped at it);
    - `oracle`: the round's A is drawn first and the head knows it: c_j = 1 for j <= A, 0 after, so the
      threshold rule verifies exactly the A drafts that will be accepted (A is unchanged, the verify is as
      short as it can be: the bound of what a schedule saves at this distribution).

    `confidence` is called for every decoding row before the verify, `accept` once for each of them after
    it, in the same row order (the engine's), so each row's accept returns the A its confidences told;
    without a preceding `confidence` (the full schedule) `accept` draws as `forced_acceptance` does."""

    def __init__(self, dist: dict[int, float], proposals: int, seed: int = 0, kind: str = "calibrated") -> None:
        if kind not in FORCED_CONFIDENCE:
            raise DecodeError(f"--force-confidence {kind!r}: expected one of {', '.join(FORCED_CONFIDENCE)}")
        self.rng, self.kind, self.k = random.Random(seed), kind, int(proposals)
        self.values, self.weights = list(dist), list(dist.values())
        self.steps = calibrated_confidence(dist, self.k)
        self.pending: list[int] = []

    def _draw(self) -> int:
        return self.rng.choices(self.values, self.weights)[0]

    def confidence(self, b: int) -> list[float]:
        if self.kind == "calibrated":
            return list(self.steps)
        a = self._draw()
        self.pending.append(a)
        return [1.0] * a + [0.0] * (self.k - a)

    def accept(self, drafts: torch.Tensor, argmax: torch.Tensor) -> int:
        return self.pending.pop(0) if self.pending else self._draw()


def measured_bf16_flops(device: torch.device, n: int = 8192, iters: int = 10) -> float:
    """The card's dense bf16 matmul rate (FLOP/s): an n x n x n product timed `iters` times after a warm-up
    (0 off CUDA: no FLOP bound there)."""
    if device.type != "cuda":
        return 0.0
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize(device)
    return 2.0 * n ** 3 * iters / (start.elapsed_time(end) / 1e3)


def verify_bound(target: Any, rows: int, tokens: float, context: int, streamed: int, bandwidth: float,
                 peak_flops: float) -> dict[str, Any]:
    """The verify pass's lower bound: max(bytes it must stream / `bandwidth`, FLOPs / `peak_flops`), for
    `rows` sequences verifying `tokens` tokens in all at a context of `context`. Bytes: the weights but the
    embedding table (`streamed`), each row's GDN states (fp32, read once) and its attention K/V; FLOPs:
    2 x the matmul parameters (the streamed weights' elements) x tokens (attention's own FLOPs not counted)."""
    cfg = target.config
    n_gdn = sum(t != "full_attention" for t in cfg.layer_types)
    state = n_gdn * int(cfg.linear_num_value_heads) * int(cfg.linear_key_head_dim) * int(cfg.linear_value_head_dim) * 4
    nbytes = streamed + rows * (state + kv_bytes(target, context))
    params = streamed / target.dtype.itemsize
    flops = 2.0 * params * tokens
    mem_ms = nbytes / bandwidth * 1e3 if bandwidth > 0 else None
    flop_ms = flops / peak_flops * 1e3 if peak_flops > 0 else None
    parts = [x for x in (mem_ms, flop_ms) if x is not None]
    return {"bytes": nbytes, "flops": flops, "memory_ms": mem_ms, "flops_ms": flop_ms,
            "bound_ms": max(parts) if parts else None}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_generation(engine: Engine, prompt: torch.Tensor, new_tokens: int, repeats: int) -> list[Generation]:
    engine.generate(prompt, new_tokens)  # warm-up: allocation, graph capture, kernel autotuning
    return [engine.generate(prompt, new_tokens) for _ in range(repeats)]


def _summary(gens: list[Generation]) -> dict[str, float]:
    wall = statistics.median(g.wall_s for g in gens)
    decode = statistics.median(g.wall_s - g.prefill_s for g in gens)
    n = len(gens[0].tokens)
    rounds = [len(g.accepted) for g in gens]
    acc = [a for g in gens for a in g.accepted]
    return {
        "new_tokens": n, "wall_s": wall, "prefill_s": statistics.median(g.prefill_s for g in gens),
        "tokens_per_s": n / wall, "decode_tokens_per_s": (n - 1) / decode if decode > 0 else 0.0,
        "rounds": statistics.median(rounds), "tau": (sum(a + 1 for a in acc) / len(acc)) if acc else None,
    }


def time_verify(target: Any, prompt: torch.Tensor, sizes: list[int], iters: int, graphs: bool,
                min_len: int = 0) -> dict[int, float]:
    """ms per (verify of t tokens + commit(1)) at a context of len(prompt) .. + iters.

    t = 1 runs on a cache shaped like the AR engine's (room for 1 verified token), the other sizes
    on one shaped like a drafting engine's (K+1), both at least `min_len` long: compiled layers
    then see the shapes they were compiled for in the engines, and nothing recompiles here."""
    dev = target.device
    vocab = target.config.vocab_size
    t_max = max(sizes)
    length = max(prompt.numel() + (iters + 3) * len(sizes) + t_max + 1, min_len)
    caches: dict[int, Any] = {}
    out: dict[int, float] = {}
    for t in sizes:
        room = 1 if t == 1 else t_max
        if room not in caches:
            cache = target.new_cache(1, length, max_verify=room)
            runner = GraphRunner(target, []) if graphs else None
            if runner is not None:
                runner.prepare(cache)
            target.prefill(prompt[None].to(dev), cache, last_logits_only=True)  # its logits are not read
            caches[room] = (cache, runner)
        cache, runner = caches[room]
        block = torch.randint(0, vocab, (1, t), device=dev)
        verify = (lambda b: runner.verify(b, cache)) if runner is not None else (lambda b: target.verify(b, cache))
        for _ in range(3):  # warm-up (captures the graph)
            verify(block)
            target.commit(cache, 1)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            verify(block)
            target.commit(cache, 1)
        _sync(dev)
        out[t] = (time.perf_counter() - t0) / iters * 1e3
    return out


# --- real drafters at the preset's size ------------------------------------------------------------

def bench_config(preset: str, overrides: Sequence[str] = ()) -> Any:
    """The benchmark's typed config: `ready.config.load_config` of the drafter preset and the command line's
    `a.b=v` overrides; a preset that does not exist is the loader's line, naming `--drafter-preset`."""
    try:
        return load_config(preset=preset, overrides=overrides)
    except ConfigError as e:
        if preset in preset_names():
            raise  # a bad override: the loader's line as it is
        raise DecodeError(f"--drafter-preset {preset!r}: {e}") from None


def drafter_configs(preset: str, proposals: int, config: Any = None) -> tuple[Any, Any]:
    """(drafter, reader) configs of the preset (`ready.config.load_config`), or copies of `config`'s (the
    benchmark's, `bench_config`), proposing K = `proposals`."""
    if config is None:
        try:
            config = load_config(preset=preset)
        except ConfigError as e:
            raise DecodeError(f"--drafter-preset {preset!r}: {e}") from None
    else:
        config = copy.deepcopy(config)
    config.drafter.proposals = proposals
    return config.drafter, config.reader


def build_drafter(target: Any, kind: str, preset: str, proposals: int, seed: int, config: Any = None) -> Any:
    """A DSpark drafter (`dspark`) or one with ReaDy readers (`ready`) in the target's dtype, random
    weights: the same seed gives both the same backbone; the parts that start at zero (sequence head
    output, reader output) get random values too, so nothing is timed on zeros. Its sizes: `config`'s
    drafter and reader sections (the benchmark's config), else the preset's."""
    dcfg, rcfg = drafter_configs(preset, proposals, config)
    rcfg.enabled = kind == "ready"
    torch.manual_seed(seed)
    d = DSparkDrafter(dcfg, rcfg, target)
    with torch.no_grad():
        if d.markov_head.rank:  # a DFlash drafter (drafter.head: none) has no Markov head
            d.markov_head.markov_w2.weight.normal_(std=0.02)
        for r in d.readers.values():
            r.fuse_out.weight.normal_(std=0.02)
    return d.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)


class _Timed:
    """Per-round device time of draft, verify and commit in one engine (CUDA events; host clock on CPU)."""

    round_start = "draft"  # the mark whose successive starts delimit a round

    def __init__(self, engine: Engine) -> None:
        self.engine, self.cuda = engine, engine.device.type == "cuda"
        self.marks: dict[str, list] = {"draft": [], "verify": [], "commit": []}

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*a: Any, **k: Any) -> Any:
            start = self._mark()
            out = fn(*a, **k)
            self.marks[name].append((start, self._mark()))
            return out
        return timed

    def __enter__(self) -> "_Timed":
        s = self.engine.slots
        if not self.engine.k:  # AR: a round is a verify and its commit
            self.round_start = "verify"
        s.draft = self._wrap("draft", s.draft)
        s.verify = self._wrap("verify", s.verify)
        s.commit = self._wrap("commit", s.commit)
        return self

    def __exit__(self, *exc: Any) -> None:
        s = self.engine.slots
        del s.draft, s.verify, s.commit

    def _ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def summary(self) -> dict[str, float]:
        _sync(self.engine.device)
        out = {k: statistics.median(self._ms(a, b) for a, b in v) * 1e3 for k, v in self.marks.items() if v}
        starts = [a for a, _ in self.marks[self.round_start]]
        rounds = [self._ms(a, b) for a, b in zip(starts, starts[1:])]
        if rounds:
            out["rounds"] = (self._ms(starts[0], self.marks["commit"][-1][1]) if self.marks["commit"]
                             else sum(rounds)) * 1e3  # the whole decode loop, device clock
            out["round"] = statistics.median(rounds) * 1e3
            # where a generation's time varies: rounds far above the median (host stalls?), and the last
            # round (cut by the budget: a shorter verify, off the K+1 graph)
            out["tail"] = sum(max(0.0, r * 1e3 - 1.5 * out["round"]) for r in rounds)
            if self.marks["commit"]:
                out["last_round"] = self._ms(starts[-1], self.marks["commit"][-1][1]) * 1e3
            out["other"] = out["round"] - out.get("draft", 0) - out.get("verify", 0) - out.get("commit", 0)
        return {f"{k}_us": round(v, 1) for k, v in out.items()}


def time_readers(drafter: Any, cache: Any, iters: int = 20, batch: int = 1) -> dict[str, float]:
    """µs per draft step of the readers' own work (norm, query, fused read, MLP, residual) and of the
    fused read alone, for `batch` rows of the cache, each as `iters` calls inside one CUDA graph (the
    draft graph runs them so)."""
    if not drafter.reader_enabled or cache.ssm.device.type != "cuda":
        return {}
    R, D = drafter.proposals + 1, drafter.hidden_size  # the reader reads every row of the block (anchor + K)
    src = StateSource.from_cache(cache.ssm, drafter._gdn_indices, batch)
    h = torch.randn(batch, R, D, device=cache.ssm.device, dtype=drafter.fc.weight.dtype)
    readers = list(drafter.readers.values())
    r0 = readers[0]
    z = torch.randn(batch, R, r0.num_pairs, r0.rank, device=h.device, dtype=h.dtype)

    def graph_us(fn: Callable[[], Any]) -> float:
        graph, _ = capture(lambda: [fn() for _ in range(iters)], 1, "reader timing", fallback=False)
        return round(replay_us(graph, iters), 2)

    return {"readers_us": graph_us(lambda: [r(h, src) for r in readers]),
            "fused_read_us": graph_us(lambda: read_states(src.ssm, src.layer_idx, src.slots, z, r0.U, r0.V, r0.eps)),
            "state_dtype": str(cache.ssm.dtype).replace("torch.", "")}


def _profile_rounds(engine: Engine, gen: Callable[[], Generation]) -> dict[str, Any]:
    """Top device kernels (µs per round) of one generation, and the host time of the draft calls."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        g = gen()
        _sync(engine.device)
    rounds = max(1, len(g.accepted))
    key = "device_time_total" if engine.device.type == "cuda" else "cpu_time_total"
    rows = {}
    for e in prof.key_averages():
        t = getattr(e, key, 0) or 0
        if t > 0 and (engine.device.type != "cuda" or getattr(e, "device_type", None) is not None):
            rows[e.key[:90]] = {"us_per_round": t / rounds, "calls_per_round": e.count / rounds}
    top = dict(sorted(rows.items(), key=lambda kv: -kv[1]["us_per_round"])[:30])
    return {"rounds": rounds, "kernels": rows, "top": top}


def _profile_diff(a: dict, b: dict, n: int = 15) -> list[dict]:
    """Kernels whose µs per round differ most between two profiles (b - a)."""
    names = set(a["kernels"]) | set(b["kernels"])
    diff = []
    for k in names:
        ua = a["kernels"].get(k, {}).get("us_per_round", 0.0)
        ub = b["kernels"].get(k, {}).get("us_per_round", 0.0)
        diff.append({"kernel": k, "dspark_us": round(ua, 2), "ready_us": round(ub, 2), "extra_us": round(ub - ua, 2),
                     "ready_calls_per_round": round(b["kernels"].get(k, {}).get("calls_per_round", 0.0), 2)})
    return sorted(diff, key=lambda d: -abs(d["extra_us"]))[:n]


TOLERANCE_PCT = 0.25  # the smallest TPS-ratio / breakdown disagreement that fails a run (see `consistency`)


def abba(pairs: int) -> list[tuple[int, int]]:
    """The order of the two drafters in each pair: (0, 1), (1, 0), (1, 0), (0, 1), ... (ABBA), so a drift
    over time and an order effect inside a pair hit both drafters alike."""
    return [(0, 1) if i % 4 in (0, 3) else (1, 0) for i in range(pairs)]


def paired_ratio(num_s: list[float], den_s: list[float], orders: list[tuple[int, int]],
                 level: float = 0.95) -> dict[str, Any]:
    """The ratio num/den of paired durations as a geometric mean with a t-interval over the pairs' log
    ratios; `order_effect_pct`: how much larger the ratio is in pairs where `num` ran first (the cause
    a fixed order hides; 0 when every pair has one order)."""
    logs = [math.log(a / b) for a, b in zip(num_s, den_s)]
    n = len(logs)
    mean, lo, _ = mean_interval(logs, level) or (statistics.fmean(logs), -math.inf, math.inf)
    half = mean - lo
    sd = statistics.stdev(logs) if n > 1 else float("inf")
    first = [x for x, o in zip(logs, orders) if o == (0, 1)]
    later = [x for x, o in zip(logs, orders) if o == (1, 0)]
    order = (statistics.fmean(first) - statistics.fmean(later)) if first and later else 0.0
    return {"ratio": math.exp(mean), "lo": math.exp(mean - half), "hi": math.exp(mean + half),
            "half_width_pct": 100 * (math.exp(half) - 1), "pairs": n, "log_mean": mean,
            "log_se": sd / math.sqrt(n) if n > 1 else float("inf"),
            "order_effect_pct": 100 * (math.exp(order) - 1), "per_pair": [round(math.exp(x), 5) for x in logs]}


def paired_difference(a: list[float], b: list[float], level: float = 0.95) -> dict[str, float]:
    """Mean of the pairs' differences a - b with its t-interval (µs of one part of a round, per pair)."""
    d = [x - y for x, y in zip(a, b)]
    mean, lo, hi = mean_interval(d, level) or (statistics.fmean(d), -math.inf, math.inf)
    return {"mean": round(mean, 1), "lo": round(lo, 1), "hi": round(hi, 1), "pairs": len(d)}


def consistency(timed: dict[str, Any], events: dict[str, Any], tolerance_pct: float = TOLERANCE_PCT) -> dict[str, Any]:
    """Do the untimed-by-events ratio and the ratio of the breakdown's round sums agree? They disagree
    when the 99 % interval of their log difference excludes 0 and the difference exceeds
    `tolerance_pct` (events or order disturbing what they measure)."""
    diff = timed["log_mean"] - events["log_mean"]
    se = math.hypot(timed["log_se"], events["log_se"])
    df = min(timed["pairs"], events["pairs"]) - 1
    half = t_quantile(0.995, df) * se if df > 0 else float("inf")
    pct = 100 * (math.exp(diff) - 1)
    agree = abs(diff) <= half or abs(pct) <= tolerance_pct
    return {"difference_pct": pct, "lo_pct": 100 * (math.exp(diff - half) - 1),
            "hi_pct": 100 * (math.exp(diff + half) - 1), "tolerance_pct": tolerance_pct, "consistent": agree}


def bench_drafters(target: Any, kinds: list[str], preset: str, proposals: int, dists: list[tuple[str, dict]],
                   prompt: torch.Tensor, new_tokens: int, pairs: int, graphs: bool, seed: int,
                   ar_decode_tps: float, breakdown: bool, profile: bool,
                   tolerance_pct: float = TOLERANCE_PCT, config: Any = None) -> dict[str, Any]:
    """DSpark and ReaDy through the engine under identical forced acceptance; see the module docstring.

    Both engines are warmed up alike (reserve + two generations, ABBA); then `pairs` timed pairs in ABBA
    order without events, and with `breakdown` as many pairs again with CUDA events around each part."""
    engines = {k: Engine(target, build_drafter(target, k, preset, proposals, seed, config), eos_token_id=-1,
                         cuda_graphs=graphs)
               for k in kinds}
    names = list(engines)
    out: dict[str, Any] = {"preset": preset, "resolved": {k: e.drafter.resolved() for k, e in engines.items()},
                           "drafter_params": {k: sum(p.numel() for p in e.drafter.parameters()) for k, e in engines.items()},
                           "pairs": pairs, "order": "ABBA", "runs": []}
    for i, (text, dist) in enumerate(dists):
        def gen(e: Engine) -> Generation:
            e.accept_fn = forced_acceptance(dist, seed + i)  # the same accepted lengths for every run
            return e.generate(prompt, new_tokens)

        def in_pairs(n: int, one: Callable[[str], Any]) -> tuple[dict[str, list], list[tuple[int, int]]]:
            got: dict[str, list] = {k: [] for k in names}
            orders = abba(n) if len(names) == 2 else [(0,)] * n
            for order in orders:
                for j in order:
                    got[names[j]].append(one(names[j]))
            return got, orders

        for e in engines.values():  # warm-up as evaluate does: reserve, then generations (captures, compiles, tunes)
            e.reserve(prompt.numel() + new_tokens)
        def dspark_first(orders: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
            """Each pair's order with DSpark as 0, as `paired_ratio` reads it: (0, 1) = DSpark ran first."""
            return [o if names[0] == "dspark" else o[::-1] for o in orders]

        in_pairs(2, lambda k: gen(engines[k]))
        progress(f"{text}: {', '.join(names)} warmed up (graphs captured, layers compiled, kernels tuned)")
        gens, orders = in_pairs(pairs, lambda k: gen(engines[k]))
        run: dict[str, Any] = {"spec": text, "accept_dist": dist,
                               "expected_tau": sum(p * (a + 1) for a, p in dist.items())}
        for k, gl in gens.items():
            res = _summary(gl)
            res["decode_tps_runs"] = [round((len(g.tokens) - 1) / (g.wall_s - g.prefill_s), 2) for g in gl]
            res["decode_speedup_vs_ar"] = res["decode_tokens_per_s"] / ar_decode_tps if ar_decode_tps else None
            res["round_ms"] = (statistics.median(g.wall_s - g.prefill_s for g in gl) * 1e3 / res["rounds"]
                               if res["rounds"] else None)
            run[k] = res
        both = "dspark" in gens and "ready" in gens
        if both:  # ReaDy TPS / DSpark TPS = DSpark decode time / ReaDy decode time (the same tokens)
            ratio = paired_ratio([g.wall_s - g.prefill_s for g in gens["dspark"]],
                                 [g.wall_s - g.prefill_s for g in gens["ready"]],
                                 dspark_first(orders))
            run["ready_over_dspark"] = ratio["ratio"]
            run["ready_over_dspark_interval"] = {k: v for k, v in ratio.items() if k != "per_pair"}
            run["ready_over_dspark_pairs"] = ratio["per_pair"]
            run["same_rounds"] = [len(g.accepted) for g in gens["dspark"]] == [len(g.accepted) for g in gens["ready"]]
            progress(f"{text}: ReaDy / DSpark TPS {ratio['ratio']:.4f} [{ratio['lo']:.4f}, {ratio['hi']:.4f}] "
                     f"over {pairs} pairs")
        else:
            progress(f"{text}: " + ", ".join(f"{k} {run[k]['decode_tokens_per_s']:.1f} decode tok/s" for k in gens))
        if breakdown:
            def timed(k: str) -> dict[str, Any]:
                with _Timed(engines[k]) as t:
                    g = gen(engines[k])
                return {"summary": t.summary(), "decode_s": g.wall_s - g.prefill_s}
            parts, border = in_pairs(pairs, timed)
            for k in names:
                run[k]["breakdown"] = {key: round(statistics.median(p["summary"][key] for p in parts[k]), 1)
                                       for key in parts[k][0]["summary"]}
                run[k]["breakdown"]["pairs"] = pairs
                # what the events cost: decode with events over decode without (host clock, medians)
                run[k]["events_over_plain"] = (statistics.median(p["decode_s"] for p in parts[k])
                                               / statistics.median(g.wall_s - g.prefill_s for g in gens[k]))
            if both:
                run["reader_extra_draft_us"] = round(run["ready"]["breakdown"]["draft_us"]
                                                     - run["dspark"]["breakdown"]["draft_us"], 1)
                ev = paired_ratio([p["summary"]["rounds_us"] for p in parts["dspark"]],
                                  [p["summary"]["rounds_us"] for p in parts["ready"]],
                                  dspark_first(border))
                run["breakdown_ratio"] = {k: v for k, v in ev.items() if k != "per_pair"}
                run["breakdown_ratio"]["per_pair"] = ev["per_pair"]
                # the robust figure: DSpark's median round over ReaDy's (rounds identical by construction),
                # untouched by the few long rounds that make whole-generation times noisy
                med = paired_ratio([p["summary"]["round_us"] for p in parts["dspark"]],
                                   [p["summary"]["round_us"] for p in parts["ready"]],
                                   dspark_first(border))
                run["ready_over_dspark_median_round"] = med
                run["ready_minus_dspark_us"] = {part: paired_difference([p["summary"][part] for p in parts["ready"]],
                                                                         [p["summary"][part] for p in parts["dspark"]])
                                                for part in ("round_us", "draft_us", "verify_us", "commit_us", "other_us")
                                                if part in parts["ready"][0]["summary"]}
                run["consistency"] = consistency(ratio, ev, tolerance_pct)
                progress(f"{text}: median round ReaDy / DSpark {med['ratio']:.4f} [{med['lo']:.4f}, {med['hi']:.4f}]; "
                         f"consistent: {run['consistency']['consistent']}")
        out["runs"].append(run)
    if "ready" in engines:
        out["reader"] = time_readers(engines["ready"].drafter, engines["ready"].slots.cache)
    if profile and dists:
        text, dist = dists[0]
        profs = {}
        for k, e in engines.items():
            e.accept_fn = forced_acceptance(dist, seed)
            profs[k] = _profile_rounds(e, lambda e=e: e.generate(prompt, new_tokens))
        out["profile"] = {k: {"rounds": p["rounds"], "top": p["top"]} for k, p in profs.items()}
        if "dspark" in profs and "ready" in profs:
            out["profile"]["ready_minus_dspark"] = _profile_diff(profs["dspark"], profs["ready"])
    return out


def _batch_summary(results: list[Any]) -> dict[str, Any]:
    """Throughput of timed `Engine.decode` calls (median over repeats)."""
    walls = [r.wall_s for r in results]
    decode = [r.wall_s - sum(g.prefill_s for g in r.generations) for r in results]
    r0 = results[0]
    n, prompts = r0.new_tokens, len(r0.generations)
    acc = [a for g in r0.generations for a in g.accepted]
    wall, dec = statistics.median(walls), statistics.median(decode)
    verified = [n + 1 for g in r0.generations for n in g.verified]
    return {"prompts": prompts, "new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
            "decode_tokens_per_s": (n - prompts) / dec if dec > 0 else 0.0, "rounds": r0.rounds,
            "round_ms": dec * 1e3 / r0.rounds if r0.rounds else None,
            "tau": (sum(a + 1 for a in acc) / len(acc)) if acc else None,
            # per row and round: the tokens its schedule verified (drafts + the anchor); per round: the tokens
            # the verify pass ran over (slots x the pass's width: the longest scheduled row's)
            "verified_per_round": statistics.fmean(verified) if verified else None,
            "verify_tokens_per_round": statistics.fmean(r0.verify_tokens) if r0.verify_tokens else None,
            "decode_tps_runs": [round((r.new_tokens - prompts) / d, 2) if d > 0 else 0.0 for r, d in zip(results, decode)]}


def method_schedule(method: str) -> tuple[str, str]:
    """A batched method key -> (drafter kind, verify schedule): `ready` runs the full schedule,
    `ready@confidence` the confidence one."""
    kind, _, schedule = method.partition("@")
    return kind, schedule or "full"


def bench_batched(target: Any, kinds: list[str], preset: str, proposals: int, dist: Optional[tuple[str, dict]],
                  prompt_len: int, new_tokens: int, batches: list[int], waves: int, repeats: int, graphs: bool,
                  seed: int, temperature: float = 0.0, slots: Optional[str] = None,
                  one_at_a_time: bool = False, schedules: Sequence[VerifySchedule] = (VerifySchedule(),),
                  force_confidence: str = "calibrated", streamed: int = 0, bandwidth: float = 0.0,
                  peak_flops: float = 0.0, top_p: float = 1.0, config: Any = None) -> dict[str, Any]:
    """AR, DSpark and ReaDy through an `Engine` of B slots at each batch size (concurrency):
    `waves` x B prompts of `prompt_len` random tokens per timed call (slots are refilled as rows end), TPS =
    all new tokens / wall time. The drafters decode under forced acceptance (`dist`, reseeded per call, so
    DSpark and ReaDy run identical rounds); `reader_share` = (ReaDy's draft µs - DSpark's) / ReaDy's round µs
    (per-round medians, CUDA events), `ready_over_dspark` = ReaDy TPS / DSpark TPS. `temperature` > 0: every
    method samples (one seed per prompt) and the drafters' rounds follow the real acceptance rule, not `dist`
    (random weights: few drafts survive), so the figures are the cost of the batched sampling path. `slots`:
    the engine's slot store (`ready.decode.slots`; default single at B = 1, ragged above).
    The methods' timed calls are interleaved over engines held together, so drifts of the device hit them
    alike; `one_at_a_time` builds, times and frees one method's drafter and engine after another instead,
    for batch sizes whose three caches do not fit beside the target (B = 32 of the 27B on an 80 GB card).
    `schedules` (`ready.decode.schedule`): each drafter kind runs under each; a confidence schedule's method
    is `<kind>@confidence`, and under forced acceptance its confidences are forced too (`ForcedRounds`,
    `force_confidence`: calibrated | oracle); its verify graphs are captured as the warm-up call meets their
    lengths (the timed calls replay its rounds). `verify_bound` (with `streamed` weight bytes, `bandwidth`,
    `peak_flops`): each drafting method's verify pass against its bound at its mean pass tokens, and
    `verify_over_bound` = the breakdown's median verify µs / that bound."""
    gen = torch.Generator().manual_seed(seed + 1)
    vocab = target.config.vocab_size
    out: dict[str, Any] = {"batches": list(batches), "waves": waves, "temperature": temperature, "slots": slots or "auto",
                           "accept_dist": None if dist is None or temperature > 0 else dist[1],
                           "spec": None if dist is None else dist[0], "one_at_a_time": one_at_a_time, "runs": []}
    sampling = SamplingParams(temperature, top_p, seed) if temperature > 0 else None
    by_kind = {s.kind: s for s in schedules}
    drafting = [k if s.kind == "full" else f"{k}@{s.kind}" for s in schedules for k in kinds]
    methods = ["ar"] + (drafting if dist is not None or sampling is not None else [])
    out["schedules"] = {s.kind: {"confidence_threshold": s.threshold, "verify_budget": s.budget} for s in schedules}
    out["force_confidence"] = force_confidence if any(s.scheduled for s in schedules) else None
    out["peak_flops"], out["bandwidth"] = peak_flops or None, bandwidth or None
    held = {} if one_at_a_time else {k: build_drafter(target, k, preset, proposals, seed, config) for k in kinds}

    def engine(k: str, B: int) -> Engine:
        kind, schedule = method_schedule(k)
        d = None if k == "ar" else (held[kind] if kind in held
                                    else build_drafter(target, kind, preset, proposals, seed, config))
        plan = VerifySchedule() if k == "ar" else by_kind[schedule]  # AR has no drafts (and `full` may not be listed)
        forced = dist is not None and sampling is None and plan.scheduled
        return Engine(target, d, batch_size=B, eos_token_id=-1, cuda_graphs=graphs, sampling=sampling, slots=slots,
                      verify_schedule=plan, capture_all_lengths=not forced,
                      confidence_fn=(lambda b: [1.0] * proposals) if forced else None)

    def free() -> None:  # a dropped engine's cache and graphs back to the device before the next one
        gc.collect()
        if target.device.type == "cuda":
            torch.cuda.empty_cache()

    for B in batches:
        prompts = [torch.randint(0, vocab, (prompt_len,), generator=gen) for _ in range(B * waves)]
        if target.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(target.device)

        def call(k: str, e: Any) -> Any:
            if sampling is not None:
                return e.decode(prompts, new_tokens, seeds=list(range(len(prompts))))
            if k != "ar" and method_schedule(k)[1] == "full":
                e.accept_fn = forced_acceptance(dist[1], seed)  # the same accepted lengths for both drafters
            elif k != "ar":  # and, scheduled, the same forced confidences
                rounds = ForcedRounds(dist[1], proposals, seed, force_confidence)
                e.accept_fn, e.confidence_fn = rounds.accept, rounds.confidence
            return e.decode(prompts, new_tokens)

        def warm(k: str, e: Any) -> None:  # allocation, graph capture, compile, kernel tuning
            e.reserve(prompt_len + new_tokens)
            call(k, e)

        def breakdown(k: str, e: Any) -> dict[str, Any]:
            with _Timed(e) as t:
                call(k, e)
            return t.summary()

        timed: dict[str, list] = {k: [] for k in methods}
        parts: dict[str, dict] = {}
        readers: dict[str, Any] = {}
        if one_at_a_time:
            for k in methods:
                e = engine(k, B)
                warm(k, e)
                progress(f"batch {B}: {k} built and warmed up (graphs captured, layers compiled, kernels tuned)")
                timed[k] = [call(k, e) for _ in range(repeats)]
                if k != "ar":
                    parts[k] = breakdown(k, e)
                if k == "ready" and "dspark" in methods:
                    readers = time_readers(e.drafter, e.slots.cache, batch=B)
                del e
                free()
        else:
            engines = {k: engine(k, B) for k in methods}
            progress(f"batch {B}: {', '.join(methods)} built")
            for k, e in engines.items():
                warm(k, e)
                progress(f"batch {B}: {k} warmed up (graphs captured, layers compiled, kernels tuned)")
            for _ in range(repeats):  # interleaved, so drifts of the device hit every method alike
                for k, e in engines.items():
                    timed[k].append(call(k, e))
            parts = {k: breakdown(k, e) for k, e in engines.items() if k != "ar"}
            if "dspark" in engines and "ready" in engines:
                readers = time_readers(engines["ready"].drafter, engines["ready"].slots.cache, batch=B)
            del engines
            free()
        run: dict[str, Any] = {"batch": B, **{k: _batch_summary(v) for k, v in timed.items()}}
        if target.device.type == "cuda":  # the high-water mark of this batch size, weights included
            run["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated(target.device) / 1e9, 2)
        ar_tps = run["ar"]["decode_tokens_per_s"]
        for k in methods[1:]:
            run[k]["decode_speedup_vs_ar"] = run[k]["decode_tokens_per_s"] / ar_tps if ar_tps else None
            run[k]["breakdown"] = parts[k]
            if run[k].get("verify_tokens_per_round"):  # the verify pass against its bound
                bound = verify_bound(target, B, run[k]["verify_tokens_per_round"], prompt_len + new_tokens // 2,
                                     streamed, bandwidth, peak_flops)
                run[k]["verify_bound"] = bound
                if bound["bound_ms"] and parts[k].get("verify_us"):
                    run[k]["verify_over_bound"] = parts[k]["verify_us"] / (bound["bound_ms"] * 1e3)
        for kind in kinds:  # what the confidence schedule changes, per drafter kind
            for s in schedules:
                key = f"{kind}@{s.kind}"
                if s.scheduled and key in run and kind in run and run[kind]["decode_tokens_per_s"]:
                    run[key]["over_full"] = run[key]["decode_tokens_per_s"] / run[kind]["decode_tokens_per_s"]
        if "ready@confidence" in timed and "dspark@confidence" in timed:
            run["ready_over_dspark_confidence"] = (run["ready@confidence"]["decode_tokens_per_s"]
                                                   / run["dspark@confidence"]["decode_tokens_per_s"])
        if "dspark" in timed and "ready" in timed:
            a, b = run["dspark"], run["ready"]
            run["same_rounds"] = [r.rounds for r in timed["dspark"]] == [r.rounds for r in timed["ready"]]
            run["ready_over_dspark"] = b["decode_tokens_per_s"] / a["decode_tokens_per_s"]
            bd, ba = b["breakdown"], a["breakdown"]
            if "round_us" in bd:
                run["reader_extra_draft_us"] = round(bd["draft_us"] - ba["draft_us"], 1)
                run["reader_share"] = (bd["draft_us"] - ba["draft_us"]) / bd["round_us"]
            run["reader"] = readers
            if readers.get("readers_us") and bd.get("round_us"):  # the readers' own µs (CUDA graph) / round
                run["reader_share_direct"] = readers["readers_us"] / bd["round_us"]
        out["runs"].append(run)
        progress(f"batch {B}: decode tok/s " + ", ".join(f"{k} {run[k]['decode_tokens_per_s']:.1f}" for k in timed))
    return out


def first_vs_later(target: Any, preset: str, proposals: int, dist: dict, prompt: torch.Tensor, new_tokens: int,
                   repeats: int, graphs: bool, seed: int, config: Any = None) -> dict[str, Any]:
    """Decode TPS of the first and of a second engine of the process (each with its own ReaDy drafter),
    each warmed up exactly as `ready.decode.evaluate` does before its clock starts."""
    out: dict[str, Any] = {}
    for name in ("first", "later"):
        e = Engine(target, build_drafter(target, "ready", preset, proposals, seed, config), eos_token_id=-1,
                   cuda_graphs=graphs, accept_fn=forced_acceptance(dist, seed))
        t0 = time.perf_counter()
        _warm_up(e, [prompt], new_tokens, 1)
        warm_s = time.perf_counter() - t0
        gl = []
        for _ in range(repeats):
            e.accept_fn = forced_acceptance(dist, seed)
            gl.append(e.generate(prompt, new_tokens))
        out[name] = {"warmup_s": round(warm_s, 2), **_summary(gl),
                     "decode_tps_runs": [round((len(g.tokens) - 1) / (g.wall_s - g.prefill_s), 2) for g in gl]}
    out["later_over_first"] = out["later"]["decode_tokens_per_s"] / out["first"]["decode_tokens_per_s"]
    return out


def bench(target_spec: str, device: str, dtype: str, prompt_len: int | list[int], new_tokens: int, proposals: int,
          dists: list[str], repeats: int, verify_iters: int, bandwidth: float, cuda_graphs: Optional[bool],
          compile_layers: Optional[bool], seed: int, drafters: tuple[str, ...] = ("random",),
          drafter_preset: Optional[str] = None, verify_tokens: Optional[list[int]] = None,
          breakdown: bool = False, profile: bool = False, first_later: bool = False,
          batches: Optional[list[int]] = None, waves: int = 1, batch_only: bool = False,
          pairs: int = 10, tolerance_pct: float = TOLERANCE_PCT, temperature: float = 0.0,
          slots: Optional[str] = None, on_length: Optional[Callable[[dict[str, Any]], None]] = None,
          one_at_a_time: bool = False, prefill_chunk: int = 0,
          schedules: Sequence[VerifySchedule] = (VerifySchedule(),), force_confidence: str = "calibrated",
          peak_flops: Optional[float] = None, top_p: float = 1.0, config: Any = None) -> dict[str, Any]:
    """Every section at one prompt length, or, for a list, the sections at each length in turn over one
    loaded target (`{"prompt_lens": [...], "by_prompt_len": [one result per length]}`). `on_length` gets the
    results so far after each length, so a run cut short keeps the lengths it finished. `prefill_chunk` > 0:
    every prefill in pieces of at most that many tokens (`HybridLM.prefill_chunk`). `schedules`,
    `force_confidence`: the batched section's verify schedules and forced confidence (`bench_batched`);
    `peak_flops`: the verify bound's FLOP rate (None: measured on the card, `measured_bf16_flops`). `config`: the
    benchmark's config (`bench_config`), whose drafter and reader sections size the real drafters (None: the
    preset's)."""
    lens = [prompt_len] if isinstance(prompt_len, int) else list(prompt_len)
    dists_parsed = [(text, parse_accept_dist(text, proposals)) for text in dists]  # fail before loading
    bad = [d for d in drafters if d not in DRAFTERS + ("none",)]
    if bad:
        raise DecodeError(f"--drafter {','.join(bad)}: expected a comma list of none, {', '.join(DRAFTERS)}")
    preset = drafter_preset or (target_spec if target_spec in PRESETS else "tiny")
    if any(d in ("dspark", "ready") for d in drafters):
        drafter_configs(preset, proposals, config)  # a bad preset fails before the target loads
    torch.manual_seed(seed)
    target = load_target(target_spec, device=device, dtype=dtype)
    progress(f"target {target_spec} loaded on {target.device} ({dtype})")
    ctx = int(target.config.max_position_embeddings)
    if max(lens) + new_tokens > ctx:
        raise DecodeError(f"--prompt-len {max(lens)} + --new-tokens {new_tokens} exceed the target's context of "
                          f"{ctx} tokens")
    if compile_layers is not None:  # None: the default (compiled layers inside CUDA graphs on CUDA)
        target.compile_layers(compile_layers)
    target.prefill_chunk = prefill_chunk
    if batches and peak_flops is None:
        peak_flops = measured_bf16_flops(target.device)
        progress(f"bf16 matmul rate {peak_flops / 1e12:.0f} TFLOP/s (the verify bound's)")
    runs: list[dict[str, Any]] = []

    def result() -> dict[str, Any]:
        if len(lens) == 1:
            return runs[0]
        return {"target": target_spec, "device": str(target.device), "dtype": dtype, "prompt_lens": lens[:len(runs)],
                "new_tokens": new_tokens, "by_prompt_len": runs}

    for i, n in enumerate(lens):
        runs.append(bench_at(target, target_spec, dtype, n, new_tokens, proposals, dists_parsed, repeats,
                             verify_iters, bandwidth, cuda_graphs, compile_layers, seed, preset, drafters,
                             verify_tokens, breakdown, profile, first_later and i == 0, batches, waves, batch_only,
                             pairs, tolerance_pct, temperature, slots, one_at_a_time=one_at_a_time,
                             schedules=schedules, force_confidence=force_confidence, peak_flops=peak_flops or 0.0,
                             top_p=top_p, config=config))
        runs[-1]["prefill_chunk"] = prefill_chunk
        if on_length is not None:
            on_length(result())
    return result()


def kv_bytes(target: Any, context: int) -> int:
    """Bytes of K and V the full-attention layers read for one token at `context` cached positions."""
    cfg = target.config
    n_full = sum(t == "full_attention" for t in cfg.layer_types)
    return 2 * n_full * int(cfg.num_key_value_heads) * int(cfg.head_dim) * int(context) * target.dtype.itemsize


def bench_at(target: Any, target_spec: str, dtype: str, prompt_len: int, new_tokens: int, proposals: int,
             dists_parsed: list[tuple[str, dict]], repeats: int, verify_iters: int, bandwidth: float,
             cuda_graphs: Optional[bool], compile_layers: Optional[bool], seed: int, preset: str,
             drafters: tuple[str, ...], verify_tokens: Optional[list[int]], breakdown: bool, profile: bool,
             first_later: bool, batches: Optional[list[int]], waves: int, batch_only: bool, pairs: int,
             tolerance_pct: float, temperature: float, slots: Optional[str] = None,
             one_at_a_time: bool = False, schedules: Sequence[VerifySchedule] = (VerifySchedule(),),
             force_confidence: str = "calibrated", peak_flops: float = 0.0, top_p: float = 1.0,
             config: Any = None) -> dict[str, Any]:
    """Every section of the benchmark at one prompt length (module docstring)."""
    dev = target.device
    if dev.type == "cuda":  # `peak_gpu_gb`: this length's high-water mark, the target's weights included
        torch.cuda.reset_peak_memory_stats(dev)
    graphs = dev.type == "cuda" if cuda_graphs is None else cuda_graphs
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(seed))
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    streamed = weight_bytes - target.embed_tokens.weight.numel() * target.embed_tokens.weight.element_size()
    batched = None
    if batches:  # first, so its timings are not taken after the single-sequence sections warmed other shapes
        kinds = [d for d in drafters if d in ("dspark", "ready")]
        batched = bench_batched(target, kinds, preset, proposals, dists_parsed[0] if dists_parsed else None,
                                prompt_len, new_tokens, batches, waves, repeats, graphs, seed, temperature, slots,
                                one_at_a_time, schedules, force_confidence, streamed, bandwidth, peak_flops, top_p,
                                config)
        if batch_only:
            return {"target": target_spec, "device": str(dev), "dtype": dtype, "cuda_graphs": graphs,
                    "params": sum(p.numel() for p in target.parameters()), "weight_bytes": weight_bytes,
                    "prompt_len": prompt_len, "new_tokens": new_tokens, "proposals": proposals,
                    "repeats": repeats, "batched": batched}

    ar_profile = None
    first = None
    if first_later and dists_parsed:  # before anything else of this process warms anything up
        first = first_vs_later(target, preset, proposals, dists_parsed[0][1], prompt, new_tokens, repeats, graphs, seed,
                               config)
    ar = _summary(_median_generation(Engine(target, eos_token_id=-1, cuda_graphs=graphs), prompt, new_tokens, repeats))
    ar["step_ms"] = 1e3 / ar["decode_tokens_per_s"] if ar["decode_tokens_per_s"] else None
    progress(f"prompt {prompt_len}: AR {ar['decode_tokens_per_s']:.1f} decode tok/s")
    if profile:  # where an AR step's time goes (graphed, compiled): top device kernels per step
        ar_engine = Engine(target, eos_token_id=-1, cuda_graphs=graphs)
        ar_engine.generate(prompt, new_tokens)
        p = _profile_rounds(ar_engine, lambda: ar_engine.generate(prompt, new_tokens))
        ar_profile = {"steps": p["rounds"], "top": p["top"]}
    sizes = sorted(set(verify_tokens if verify_tokens is not None else [2, 4]) | {1, proposals + 1})
    ms = time_verify(target, prompt, sizes, verify_iters, graphs, min_len=prompt_len + new_tokens)
    verify = {"tokens": sizes, "ms": [ms[t] for t in sizes], "step_ms": ms[1], "verify_ms": ms[proposals + 1],
              "ratio": ms[proposals + 1] / ms[1]}
    progress(f"prompt {prompt_len}: verify({proposals + 1}) / AR step {verify['ratio']:.3f}")

    forced = []
    for i, (text, dist) in enumerate(dists_parsed if "random" in drafters else []):
        engine = Engine(target, RandomDrafter(vocab, proposals, dev, seed + i), eos_token_id=-1, cuda_graphs=graphs,
                        accept_fn=forced_acceptance(dist, seed + i))
        res = _summary(_median_generation(engine, prompt, new_tokens, repeats))
        tau = res["tau"] or 1.0
        ideal = tau * verify["step_ms"] / verify["verify_ms"]
        speed = res["decode_tokens_per_s"] / ar["decode_tokens_per_s"]
        forced.append({
            "accept_dist": dist, "spec": text, "expected_tau": sum(p * (a + 1) for a, p in dist.items()),
            **res, "speedup_vs_ar": res["tokens_per_s"] / ar["tokens_per_s"], "decode_speedup_vs_ar": speed,
            "ideal_speedup": ideal, "engine_efficiency": speed / ideal,
        })

    out: dict[str, Any] = {
        "target": target_spec, "device": str(dev), "dtype": dtype, "cuda_graphs": graphs,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,  # the default bound is the H200's
        "compiled_layers": compile_layers, "params": sum(p.numel() for p in target.parameters()),
        "weight_bytes": weight_bytes, "prompt_len": prompt_len, "new_tokens": new_tokens, "proposals": proposals,
        "repeats": repeats, "ar": ar, "verify": verify, "forced": forced, "drafter_cost": "none (random drafts)",
    }
    kinds = [d for d in drafters if d in ("dspark", "ready")]
    if kinds:
        out["drafters"] = bench_drafters(target, kinds, preset, proposals, dists_parsed, prompt, new_tokens, pairs,
                                         graphs, seed, ar["decode_tokens_per_s"], breakdown, profile, tolerance_pct,
                                         config)
    if first is not None:
        out["first_vs_later"] = first
    if batched is not None:
        out["batched"] = batched
    if ar_profile is not None:
        out["ar_profile"] = ar_profile
    out["compiled_layers"] = bool(dev.type == "cuda" and graphs and target.compile_in_graphs is not False
                                  and target._compiled_fn is not None)
    try:
        from ready_kernels.small_m_gemm import TUNER, get_mode

        out["small_m"] = {"mode": get_mode(), "tuned": TUNER.report()}
        from ready.target import layers

        if layers.FUSED_GEMV is not None:
            out["fused_gemv"] = {"tuned": layers.FUSED_GEMV.TUNER.report()}
    except ImportError:  # pragma: no cover
        pass
    if dev.type == "cuda":
        out["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)
    out["source"] = {"ready": str(Path(ready.__file__).resolve().parent.parent),
                     "ready_kernels": [str(Path(p).resolve()) for p in ready_kernels.__path__][:1]}
    if bandwidth > 0:
        bound_s = streamed / bandwidth
        kv = kv_bytes(target, prompt_len + new_tokens // 2)  # the mean context of the decoded tokens
        with_kv = (streamed + kv) / bandwidth
        out["bound"] = {"bandwidth_bytes_per_s": bandwidth, "streamed_bytes": streamed, "step_ms": bound_s * 1e3,
                        "tokens_per_s": 1.0 / bound_s, "ar_fraction_of_bound": ar["decode_tokens_per_s"] * bound_s,
                        "kv_bytes": kv, "step_ms_with_kv": with_kv * 1e3,
                        "ar_fraction_of_bound_with_kv": ar["decode_tokens_per_s"] * with_kv}
    return out


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    TIMELINE.clear()  # this run's marks (one process runs main once; tests run it many times)
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.engine", description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="overrides of the typed config (ready/config.py), e.g. drafter.proposals=6 target.dtype=bfloat16")
    ap.add_argument("--target", default="tiny", help="preset or checkpoint directory (default tiny)")
    ap.add_argument("--prompt-len", default="128",
                    help="prompt tokens, or a comma list (e.g. 1024,8192,32768): every section at each length in "
                         "turn over one loaded target (default 128)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--accept-dist", action="append", default=None,
                    help="A:p,... distribution of accepted lengths for a forced-acceptance run (repeatable); "
                         "default 0:0.1,3:0.3,7:0.6 when K=7")
    ap.add_argument("--repeats", type=int, default=3, help="timed generations per measurement (median)")
    ap.add_argument("--pairs", type=int, default=10,
                    help="timed DSpark/ReaDy pairs in ABBA order (--drafter dspark,ready; default 10), as many again "
                         "with --breakdown")
    ap.add_argument("--tolerance-pct", type=float, default=TOLERANCE_PCT,
                    help=f"with --breakdown: the TPS-ratio / breakdown disagreement (%%) that fails the run (default {TOLERANCE_PCT})")
    ap.add_argument("--verify-iters", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s for the bound (default: the GPU's measured copy rate, "
                    "benchmarks.COPY_BYTES_PER_S; no bound for a card not listed there unless given)")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--drafter", default="random",
                    help="comma list of drafters to time: random (free random drafts), dspark, ready (default random)")
    ap.add_argument("--drafter-preset", default=None,
                    help="experiments/presets/<name>.yaml, the config's preset (the drafters' sizes, K, the target's dtype "
                         "and device; default: the target preset, else tiny)")
    ap.add_argument("--verify-tokens", default=None, help="comma list of verify sizes to time besides 1 and K+1 "
                    "(default 2,4); each size is one more compiled graph on CUDA")
    ap.add_argument("--breakdown", action="store_true", help="per-round µs of draft, verify, commit (drafters)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler tables of DSpark and ReaDy rounds")
    ap.add_argument("--first-later", action="store_true",
                    help="first: time the first and a second ReaDy engine of the process, each warmed up as evaluate does")
    ap.add_argument("--batch", default=None,
                    help="comma list of batch sizes (concurrency), e.g. 1,2,4,8,16: AR and the --drafter kinds "
                         "dspark/ready through the batched engine at each, under the first --accept-dist")
    ap.add_argument("--waves", type=int, default=2, help="prompts per slot in each --batch measurement (default 2)")
    ap.add_argument("--batch-only", action="store_true", help="with --batch: skip the single-sequence sections")
    ap.add_argument("--slots", choices=("single", "ragged"), default=None,
                    help="with --batch: the engine's slot store (ready.decode.slots; default single at B = 1, ragged above)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="with --batch: build, time and free one method's engine after another instead of holding "
                         "AR, DSpark and ReaDy together (not interleaved; for caches that do not fit together)")
    ap.add_argument("--verify-schedule", default=None,
                    help="with --batch: comma list of verify schedules the drafters run under, full and/or confidence "
                         "(ready.decode.schedule; default the config's eval.verify_schedule)")
    ap.add_argument("--force-confidence", choices=FORCED_CONFIDENCE, default="calibrated",
                    help="the confidence schedule's forced confidences under --accept-dist (ForcedRounds): calibrated "
                         "(the distribution's conditional acceptance, every round) or oracle (the round's drawn A)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help="FLOP/s of the verify bound (default: a bf16 matmul measured on the card; none on CPU)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="prefill prompts in pieces of at most this many tokens (0: one pass); bounds a long "
                         "prompt's activations, e.g. 8192 for 32k prompts on an 80 GB card")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--json", action="store_true", help="compact JSON (default: indented)")
    try:
        replaced_flags(argv, REPLACED)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a = ap.parse_intermixed_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        preset = a.drafter_preset or (a.target if a.target in PRESETS else "tiny")
        cfg = bench_config(preset, a.overrides)
        device, dtype, proposals = pick_device(cfg), str(cfg.target.dtype), int(cfg.drafter.proposals)
        bw = a.bandwidth if a.bandwidth is not None else copy_rate(device)
        dists = a.accept_dist if a.accept_dist is not None else (["0:0.1,3:0.3,7:0.6"] if proposals == 7 else [])
        try:
            lens = [int(x) for x in str(a.prompt_len).split(",") if x.strip()]
        except ValueError:
            raise DecodeError(f"--prompt-len {a.prompt_len!r}: expected a number or a comma list, e.g. 1024,8192") from None
        if not lens or min(lens) < 1 or a.new_tokens < 2 or a.repeats < 1 or a.pairs < 2:
            raise DecodeError("expected --new-tokens >= 2, --prompt-len >= 1, --repeats >= 1 and --pairs >= 2")
        vt = [int(t) for t in a.verify_tokens.split(",") if t.strip()] if a.verify_tokens is not None else None
        try:
            batches = [int(b) for b in a.batch.split(",") if b.strip()] if a.batch is not None else None
        except ValueError:
            raise DecodeError(f"--batch {a.batch!r}: expected a comma list of batch sizes, e.g. 1,2,4,8,16") from None
        if a.prefill_chunk < 0:
            raise DecodeError(f"--prefill-chunk {a.prefill_chunk}: expected 0 (one pass) or a number of tokens >= 1")
        if batches is not None and (not batches or min(batches) < 1 or a.waves < 1):
            raise DecodeError(f"--batch {a.batch!r} --waves {a.waves}: expected batch sizes >= 1 and --waves >= 1")
        listed = a.verify_schedule if a.verify_schedule is not None else str(cfg.eval.verify_schedule)
        kinds = [k.strip() for k in listed.split(",") if k.strip()]
        if not kinds or any(k not in SCHEDULES for k in kinds) or len(set(kinds)) != len(kinds):
            raise DecodeError(f"--verify-schedule {listed!r}: expected a comma list of {', '.join(SCHEDULES)}")
        schedules = [VerifySchedule(k, float(cfg.eval.confidence_threshold), float(cfg.eval.verify_budget)) for k in kinds]
        with torch.no_grad():
            res = bench(a.target, device, dtype, lens if len(lens) > 1 else lens[0], a.new_tokens, proposals,
                        dists, a.repeats, a.verify_iters, bw, False if a.no_cuda_graphs else None, compile_in_graphs(cfg),
                        a.seed, drafters=tuple(d.strip() for d in a.drafter.split(",") if d.strip()),
                        drafter_preset=preset, verify_tokens=vt, breakdown=a.breakdown,
                        profile=a.profile, first_later=a.first_later, batches=batches, waves=a.waves,
                        batch_only=a.batch_only, pairs=a.pairs, tolerance_pct=a.tolerance_pct,
                        temperature=float(cfg.eval.temperature), slots=a.slots, one_at_a_time=a.one_at_a_time,
                        schedules=schedules, force_confidence=a.force_confidence, peak_flops=a.peak_flops,
                        prefill_chunk=a.prefill_chunk, top_p=float(cfg.eval.top_p), config=cfg,
                        on_length=(lambda r: atomic_write_text(a.out, json.dumps(r) + "\n")) if a.out else None)
    except ValueError as e:
        if not type(e).__module__.startswith("ready"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    res["timeline_s"] = [[round(t, 1), msg] for t, msg in TIMELINE]
    text = json.dumps(res, indent=None if a.json else 2)
    if a.out:
        atomic_write_text(a.out, text + "\n")
    print(text)
    bad = [r for one in res.get("by_prompt_len", [res]) for r in one.get("drafters", {}).get("runs", [])
           if not r.get("consistency", {"consistent": True})["consistent"]]
    for r in bad:
        c = r["consistency"]
        print(f"error: --accept-dist {r['spec']}: ReaDy/DSpark TPS {r['ready_over_dspark']:.4f} and the breakdown's round sums "
              f"{r['breakdown_ratio']['ratio']:.4f} disagree by {c['difference_pct']:+.2f} % [{c['lo_pct']:+.2f}, {c['hi_pct']:+.2f}] "
              "(99 %); the timing is biased, trust neither", file=sys.stderr)
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
