"""The per-prompt evidence behind a table: each row's runs as `reports.stats` tallies, paired by seed.

A row (variant) contributes its latest finished, lossless run of every seed that logged an
evaluation.json. A comparison of row A with reference row R pairs seed s of A with seed s of R
and reads seeds and prompts as one crossed design (`reports.stats`). A reference with a
single run that shares A's base drafter (param `train.base_seed`; a spec that replicates only the
adaptation stages) is paired with each of A's seeds. Whatever cannot be paired is said in a note,
never silently dropped. Rows that resolve to the same drafter as an earlier row (a rank clamped to
d_k) are found here (`Evidence.clones`), so every table and finding can say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import polars as pl

from reports import stats
from reports import collect
from reports.collect import Variant
from reports.stats import Interval, RunTallies


@dataclass(frozen=True)
class Counts:
    """How much data stands behind a cell: seeds × prompts (per seed) and rounds (all seeds)."""

    seeds: int
    prompts: int
    rounds: int


class Evidence:
    """Per-variant, per-seed tallies of a runs frame (NOT_LOSSLESS runs already set aside)."""

    def __init__(self, runs: pl.DataFrame, evaluations: Mapping[str, dict]):
        self.by_variant: dict[str, dict[int, RunTallies]] = {}
        self.base_seed: dict[tuple[str, int], object] = {}  # (variant, seed) -> param train.base_seed
        self.devices: set[str] = set()
        self.problems: list[str] = []
        drafters: dict[str, dict[int, str]] = {}  # variant -> seed -> its trained drafter's folder
        self.resolved_rank: dict[str, tuple[int, int]] = {}  # variant -> (requested, built) reader rank
        for r in collect.finished(runs).iter_rows(named=True):
            self.base_seed[r["ready.variant_id"], r["ready.seed"] or 0] = r.get("param.train.base_seed")
            ev = evaluations.get(r["run_id"])
            key, rank = _drafter_identity(r, ev)
            if key is not None:
                drafters.setdefault(r["ready.variant_id"], {})[r["ready.seed"] or 0] = key
            if rank is not None:
                self.resolved_rank[r["ready.variant_id"]] = rank
            if ev is None:
                continue
            try:
                t = stats.tallies(ev)
            except stats.StatsError as e:
                self.problems.append(f"{r['ready.label'] or r['run_id']}: evaluation.json unreadable ({e})")
                continue
            if t.device:
                self.devices.add(t.device)
            if t.benchmarks or t.heldout_tf is not None:
                self.by_variant.setdefault(r["ready.variant_id"], {})[r["ready.seed"] or 0] = t
        self.clones = _clones(runs, drafters)
        if "param.target.device" in runs.columns:
            self.devices |= {str(d) for d in collect.finished(runs)["param.target.device"].drop_nulls()
                             if str(d) in ("cpu", "cuda")}
        self.concurrency: set[int] = set(collect.with_concurrency(collect.finished(runs))["concurrency"].to_list())

    def clone_of(self, v: Variant) -> Optional[str]:
        """The variant id of the earlier row whose drafter v resolves to (None: v is its own row)."""
        return self.clones.get(v.variant_id)

    def clone_label(self, v: Variant, names: Mapping[str, str]) -> str:
        """v's label, with "(= r=64: rank 128 clamped to d_k = 64)" when it is another row's drafter."""
        orig = self.clone_of(v)
        if orig is None:
            return v.name
        rank = self.resolved_rank.get(v.variant_id)
        why = (f"rank {rank[0]} clamped to d_k = {rank[1]}" if rank and rank[0] != rank[1] else "same drafter")
        return f"{v.name} (= {names.get(orig, orig)}: {why})"

    def has(self, v: Optional[Variant]) -> bool:
        return v is not None and bool(self.by_variant.get(v.variant_id))

    def runs(self, v: Variant) -> list[RunTallies]:
        found = self.by_variant.get(v.variant_id, {})
        return [found[s] for s in sorted(found)]

    def counts(self, v: Variant, key: str) -> Optional[Counts]:
        """Seeds, prompts per seed and rounds of `key` (a benchmark or stats.OVERALL) behind a row."""
        runs = self.runs(v)
        if not runs:
            return None
        pick = (lambda r: r.benchmarks.values()) if key == stats.OVERALL else (
            lambda r: [r.benchmarks[key]] if key in r.benchmarks else [])
        prompts = max(sum(t.size for t in pick(r)) for r in runs)
        rounds = int(sum(t.rounds.sum() for r in runs for t in pick(r)))
        return Counts(len(runs), prompts, rounds) if prompts else None

    def _shared(self, v: Variant, seed: int, ref: Variant) -> Optional[int]:
        """The seed of ref's only run when it was trained from v's base drafter at `seed`, else None."""
        b = self.by_variant.get(ref.variant_id, {})
        if len(b) != 1:
            return None
        (only,) = b
        mine, theirs = self.base_seed.get((v.variant_id, seed)), self.base_seed.get((ref.variant_id, only))
        return only if mine is not None and mine == theirs else None

    def pairs(self, v: Variant, ref: Variant) -> tuple[list[RunTallies], list[RunTallies], Optional[str]]:
        """Seed-paired runs of v and ref, and a note when a seed of v has no partner or a shared one."""
        a, b = self.by_variant.get(v.variant_id, {}), self.by_variant.get(ref.variant_id, {})
        if not a or not b:
            return [], [], None
        left, right, lone, shared = [], [], [], False
        for s in sorted(a):
            partner = s if s in b else self._shared(v, s, ref)
            if partner is None:
                lone.append(s)
                continue
            shared |= partner != s
            left.append(a[s])
            right.append(b[partner])
        note = None
        if lone:
            paired = [s for s in sorted(a) if s not in lone]
            note = (f"{v.name} vs {ref.name}: paired over seed(s) {', '.join(map(str, paired)) or 'none'}; "
                    f"{ref.name} has no run with per-prompt logs for seed(s) {', '.join(map(str, lone))}")
        elif shared:
            note = (f"{v.name} vs {ref.name}: one {ref.name} run (same base drafter) serves every seed; "
                    f"its training variance is not sampled")
        return left, right, note

    def gain(self, v: Variant, ref: Variant, key: str, metric: str = "tau") -> tuple[Optional[Interval], Optional[str]]:
        """Paired gain of v over ref in percent (τ, or TPS with metric="tps") and a note."""
        a, b, note = self.pairs(v, ref)
        if not a:
            return None, note
        try:
            return stats.gain_pct(a, b, key, metric), note
        except stats.StatsError as e:
            return None, f"{v.name} vs {ref.name}: {e}"

    def tau(self, v: Variant, key: str) -> Optional[Interval]:
        return stats.tau(self.runs(v), key) if self.has(v) else None

    def point(self, v: Variant, key: str, what: str = "tau") -> Optional[float]:
        """v's pooled τ or TPS over its seeds and prompts, without an interval (cheap)."""
        return stats.point(self.runs(v), key, what) if self.has(v) else None

    def state_reliance(self, v: Variant, key: str) -> Optional[Interval]:
        runs = self.runs(v)
        if not runs or not all(r.swapped for r in runs):
            return None
        return stats.state_reliance(runs, key)

    def survival(self, v: Variant, key: str) -> list[Optional[Interval]]:
        return stats.survival(self.runs(v), key) if self.has(v) else []

    @property
    def on_cpu(self) -> bool:
        return "cpu" in self.devices

    @property
    def timing_ranked(self) -> bool:
        """TPS may be ranked only when every run is known to have been timed on CUDA."""
        return self.devices == {"cuda"}


def _drafter_identity(run: Mapping, evaluation: Optional[Mapping]) -> tuple[Optional[str], Optional[tuple[int, int]]]:
    """(the run's trained drafter folder, (requested, built) reader rank) from its evaluation.json, each None
    when not recorded. Without evaluation.json no clone is found (tags alone cannot tell a clamped rank
    from an evaluation reused from the cache)."""
    resolved = (evaluation or {}).get("resolved") or {}
    rank = None
    if resolved.get("rank") is not None and resolved.get("rank_requested") is not None:
        rank = (int(resolved["rank_requested"]), int(resolved["rank"]))
    folder = resolved.get("drafter_dir") if run.get("ready.method") not in (None, "ar") else None
    return (str(folder) if folder else None), rank


def _clones(runs: pl.DataFrame, drafters: Mapping[str, Mapping[int, str]]) -> dict[str, str]:
    """clone variant id -> the earlier variant (by `ready.order`) that trained the same drafter in every seed."""
    order = {v.variant_id: k for k, v in enumerate(collect.aggregate(runs))}
    out: dict[str, str] = {}
    seen: list[str] = []
    for vid in sorted(drafters, key=lambda x: order.get(x, len(order))):
        mine = drafters[vid]
        orig = next((o for o in seen if all(drafters[o].get(s) == d for s, d in mine.items())), None)
        if orig is None:
            seen.append(vid)
        else:
            out[vid] = orig
    return out


def count_text(counts: Sequence[Counts]) -> str:
    """"2 seeds × 16 prompts × 410–470 rounds" (ranges over the cells), or "" without counts."""
    if not counts:
        return ""

    def span(values: list[int], unit: str) -> str:
        lo, hi = min(values), max(values)
        n = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
        return f"{n} {unit}" + ("" if hi == 1 else "s")

    return " × ".join((span([c.seeds for c in counts], "seed"), span([c.prompts for c in counts], "prompt"),
                       span([c.rounds for c in counts], "round")))
