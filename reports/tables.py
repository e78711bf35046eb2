"""The paper's tables as data: which sweep feeds which table, and the cells computed from runs.

A `Table` holds numbers, not strings; `reports.latex` and `reports.markdown` render it. Gains are
recomputed here, never read from the gains the runner logged: paired by prompt and seed from the
runs' evaluation.json with a 95 % interval (`reports.intervals`, `reports.stats`: the closed-form
crossed seeds × prompts interval), or, for runs without per-prompt logs, as a ratio of seed means.
The rules every table follows (and states in its caption):

- a comparison is marked when its p-value stays below ALPHA after Holm's correction over the
  table's comparisons (`apply_holm`);
- a row is bold only when its paired interval against every other row excludes 0 in its favour
  (`best_row`: an intersection-union test, no correction needed);
- a comparison resting on fewer than `reports.stats.MIN_DISCORDANT` differing units shows the count,
  not an interval, and is never marked (its exact sign test is `reports.findings`' to read);
- a row that resolves to another row's drafter (a rank clamped to d_k) says so in its label and is
  never marked or bolded; CPU timings are never ranked.

Not-lossless runs are left out and footnoted. A value that cannot be computed is a missing cell
(rendered as a dash) plus a note saying why, never a zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import polars as pl

from reports import stats
from reports import collect
from reports.collect import METHOD_NAMES, Stat, Variant
from reports.intervals import Counts, Evidence, count_text
from reports.stats import Interval

SUMMARY = "overall"  # the benchmark key of the whole-suite metrics the ablation tables report
POOLED = "_pooled"  # per run, every suite's prompts pooled (ratio of sums): Table 1's last row
GAIN_DECIMALS = 1  # percent gains: +5.1 [+2.0, +8.3]
DIFF_DECIMALS = 3  # state reliance, a difference of τ
TAU_DECIMALS = 3


@dataclass(frozen=True)
class TableSpec:
    """Where a sweep's table goes and how the paper titles it."""

    name: str  # output file stem (table1 .. table6)
    layout: str  # "main" | "ablation"
    title: str  # the paper's caption ("" for a sweep the paper does not have)
    row_header: str = "Variant"


TABLES: dict[str, TableSpec] = {
    "main": TableSpec("table1", "main", "Decoding performance: throughput (TPS), speedup over AR and acceptance length."),
    "ft_control": TableSpec(
        "table2", "ablation",
        "Fine-tuning control. FT denotes fine-tuning without state access; gains are relative to DSpark.",
        "Method",
    ),
    "rank": TableSpec("table3", "ablation", "Reader rank.", "Rank"),
    "layers": TableSpec("table4", "ablation", "State source layers (target layer IDs).", "Source layers"),
    "inject_layer": TableSpec("table5", "ablation", "Injection layers (zero-indexed draft layer IDs).", "Inject layers"),
    "inject_pos": TableSpec("table6", "ablation", "Injection position in the final draft layer.", "Position"),
    "positive_control": TableSpec(
        "table_positive_control", "ablation",
        "Positive control (not in the paper): the drafter's context is the token embeddings of the last "
        "committed token, so everything older reaches it only through the committed states; ReaDy must beat "
        "FT and the placebo must not.", "Variant"),
}

BENCHMARK_NAMES = {
    "gsm8k": "GSM8K",
    "math500": "MATH500",
    "math_500": "MATH500",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "livecodebench": "LiveCodeBench",
    "mtbench": "MT-Bench",
    "mt_bench": "MT-Bench",
    "alpaca": "Alpaca",
    "heldout": "Held-out",
    POOLED: "All prompts",
}


def spec_for(sweep: str, runs: pl.DataFrame) -> TableSpec:
    """The paper table for a known sweep; otherwise a table named by the runs' `ready.table` tag."""
    if sweep in TABLES:
        return TABLES[sweep]
    tags = runs["ready.table"].drop_nulls()
    tag = tags.mode().sort()[0] if len(tags) else ""
    layout = "main" if tag == "table1" else "ablation"
    name = f"{tag}_{sweep}" if re.fullmatch(r"table\d+", tag) else sweep
    return TableSpec(name, layout, "")


@dataclass
class Column:
    latex: str  # header in LaTeX
    markdown: str  # header in Markdown
    group: str = ""  # spanning header over consecutive columns with the same group
    align: str = "r"


@dataclass
class Cell:
    """One table cell. kind: text | num (value ± std or [lo, hi]) | gain (signed %) | diff (signed)
    | speedup (×). A gain or diff is marked (EFFECT_MARK) when its interval excludes 0 and its
    Holm-adjusted p (set by `apply_holm` over the table) is below ALPHA."""

    kind: str = "num"
    mean: float | None = None
    std: float | None = None
    decimals: int = 2
    text: str = ""
    bold: bool = False
    lo: float | None = None  # 95 % interval, when the cell has per-prompt evidence
    hi: float | None = None
    flag: str = ""  # a footnote mark after the text (NOT_LOSSLESS_MARK on a row label)
    ranked: bool = True  # False: shown, never marked or bolded (CPU timings, a row that is another's drafter)
    iv: Interval | None = None  # the statistics of an interval cell: p-value, MDE, discordant units
    p_adj: float | None = None  # Holm-adjusted p over the table's comparisons (`apply_holm`)

    @property
    def missing(self) -> bool:
        return self.kind != "text" and self.mean is None and not self.text

    @property
    def thin(self) -> bool:
        """A paired comparison on fewer than MIN_DISCORDANT differing units: shown as a count, no interval."""
        return self.iv is not None and self.iv.thin

    @property
    def has_interval(self) -> bool:
        return self.mean is not None and self.lo is not None and self.hi is not None and not self.thin

    @property
    def comparison(self) -> bool:
        """A ranked signed effect with a test behind it: a member of the table's Holm family."""
        return self.ranked and self.kind in ("gain", "diff") and self.has_interval and self.iv is not None

    @property
    def marked(self) -> bool:
        """A signed effect whose interval excludes 0 and whose Holm-adjusted p (when set) is below ALPHA."""
        if not (self.ranked and self.kind in ("gain", "diff") and self.has_interval and (self.lo > 0 or self.hi < 0)):
            return False
        return self.p_adj is None or self.p_adj < stats.ALPHA

    @property
    def thin_text(self) -> str:
        """"2 of 384 differ" for a thin comparison ("" otherwise)."""
        return f"{self.iv.discordant} of {self.iv.units:,} differ" if self.thin and self.iv else ""


EFFECT_MARK = "*"  # after a comparison that stays significant after Holm's correction over the table
NOT_LOSSLESS_MARK = "‡"  # after a row (or column group) with a run left out for not being lossless
CPU_TIMING = "CPU timing, indicative: TPS is not ranked"


@dataclass
class Table:
    spec: TableSpec
    sweep: str
    models: list[str]
    seeds: tuple[int, int]  # (min, max) finished seeds per variant
    columns: list[Column]
    rows: list[list[Cell]]
    rule_before: set[int] = field(default_factory=set)  # row indices preceded by a \midrule
    notes: list[str] = field(default_factory=list)  # missing values (†)
    lossless_notes: list[str] = field(default_factory=list)  # runs left out, not lossless (‡)
    about: list[str] = field(default_factory=list)  # caption sentences: data per cell, how to read it

    @property
    def label(self) -> str:
        return f"tab:ready-{self.sweep}"


def format_number(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def format_cell_parts(cell: Cell) -> tuple[str, str | None, tuple[str, str] | None]:
    """(value, std, (lo, hi)) strings of a numeric cell; std/interval None where not applicable."""
    assert cell.mean is not None
    signed = cell.kind in ("gain", "diff")
    fmt = (lambda x: f"{x:+.{cell.decimals}f}") if signed else (lambda x: format_number(x, cell.decimals))
    interval = (fmt(cell.lo), fmt(cell.hi)) if cell.has_interval else None
    std = format_number(cell.std, cell.decimals) if cell.std is not None and not signed and interval is None else None
    return fmt(cell.mean), std, interval


def _unranked(cell: Cell, ranked: bool) -> Cell:
    """A timing cell that CPU noise forbids reading as an effect: no mark, no bold."""
    cell.ranked = ranked
    return cell


def best_row(candidates: Sequence[Variant], score: Callable[[Variant], float | None],
             beats: Callable[[Variant, Variant], Interval | None]) -> Variant | None:
    """The candidate with the highest score, when its paired interval against every other candidate
    (`beats(best, other)`) excludes 0 in its favour and rests on enough differing units; else None.

    Needs two or more candidates, each with a score: a row without per-prompt evidence, or a tie
    within noise, leaves nothing bold. Each comparison at 95 %, all required: an intersection-union
    test, so the bold needs no multiplicity correction.
    """
    scored = [(score(v), v) for v in candidates]
    if len(scored) < 2 or any(x is None for x, _ in scored):
        return None
    best = max(scored, key=lambda x: x[0])[1]
    for _, other in scored:
        if other is not best:
            iv = beats(best, other)
            if iv is None or iv.thin or not iv.lo > 0:
                return None
    return best


def apply_holm(cells: Sequence[Cell]) -> int:
    """Set every comparison cell's Holm-adjusted p over this family; returns the family's size."""
    family = [c for c in cells if c.comparison]
    for c, p in zip(family, stats.holm([c.iv.p_value for c in family])):  # type: ignore[union-attr]
        c.p_adj = p
    return len(family)


def _num(stat: Stat | None, decimals: int) -> Cell:
    if stat is None:
        return Cell("num", decimals=decimals)
    return Cell("num", stat.mean, stat.std if stat.n > 1 else None, decimals)


def _interval_cell(kind: str, iv: Interval | None, decimals: int) -> Cell:
    if iv is None:
        return Cell(kind, decimals=decimals)
    return Cell(kind, iv.value, decimals=decimals, lo=iv.lo, hi=iv.hi, iv=iv)


def _ratio(a: Stat | None, b: Stat | None) -> float | None:
    if a is None or b is None or b.mean == 0:
        return None
    return a.mean / b.mean


def _gain(a: Stat | None, b: Stat | None, decimals: int = GAIN_DECIMALS) -> Cell:
    r = _ratio(a, b)
    return Cell("gain", None if r is None else 100.0 * (r - 1.0), decimals=decimals)


class _Notes:
    """Collects footnotes once each, in order."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, note: str | None) -> None:
        if note and note not in self.items:
            self.items.append(note)

    def stat(self, v: Variant, metric: str) -> Stat | None:
        s, why = v.stat(metric)
        self.add(why)
        return s


def _seed_notes(variants: Sequence[Variant], notes: _Notes, aside: dict[str, tuple[int, ...]]) -> None:
    for v in variants:
        missing = [s for s in v.missing_seeds if s not in aside.get(v.variant_id, ())]
        if missing and v.seeds:
            ms = ", ".join(str(s) for s in missing)
            have = ", ".join(str(s) for s in v.seeds)
            notes.add(f"{v.name}: mean over seed(s) {have} only; no finished run for seed(s) {ms}")


def _lossless_notes(variants: Sequence[Variant], aside: dict[str, tuple[int, ...]]) -> list[str]:
    out = []
    for v in variants:
        if v.variant_id in aside:
            seeds = ", ".join(str(s) for s in aside[v.variant_id])
            out.append(f"{v.name}: seed(s) {seeds} not lossless (speculative output differed from AR greedy); "
                       "left out of every number and gain of this row")
    return out


def _tie_flip_note(evaluations: Mapping[str, dict]) -> str | None:
    """Footnote: prompts that are greedy-valid but not identical to AR (16-bit fast mode's tie flips),
    counted from the per-prompt records of the runs' evaluation.json (docs/sweeps.md "Lossless")."""
    prompts = flips = 0
    for ev in evaluations.values():
        for bench in ((ev or {}).get("benchmarks") or {}).values():
            for rec in (bench.get("prompts") if isinstance(bench, Mapping) else None) or ():
                if isinstance(rec, Mapping) and rec.get("lossless_exact") == 0 and rec.get("greedy_valid", 1):
                    prompts += 1
                    flips += int(rec.get("tie_flips") or 0)
    if not prompts:
        return None
    return (f"Lossless here means greedy-valid: {prompts} prompt decode(s) left AR's tokens at a near-tie, with "
            f"{flips} tie flip(s) within the margin of the target's top-1 logit (16-bit fast mode)")


def _sampling_about(evaluations: Mapping[str, dict]) -> list[str]:
    """Caption sentence for runs decoded by sampling (eval.temperature > 0), from their evaluation.json."""
    seen = set()
    for ev in evaluations.values():
        for bench in ((ev or {}).get("benchmarks") or {}).values():
            info = bench.get("sampling") if isinstance(bench, Mapping) else None
            if isinstance(info, Mapping):
                seen.add((info.get("temperature"), info.get("top_p"), info.get("samples")))
    if not seen:
        return []
    settings = "; ".join(f"temperature {t}, top-p {p}, {n} samples per prompt" for t, p, n in sorted(seen, key=str))
    return [f"Sampled decoding ({settings}): the same seed for a (prompt, sample) in every row; τ, survival and "
            "TPS count speculative sampling's acceptances; lossless = the distribution check (docs/sweeps.md)."]


def _baseline(variants: Sequence[Variant], method: str, notes: _Notes, sweep: str, purpose: str) -> Variant | None:
    found = [v for v in variants if v.method == method]
    if not found:
        notes.add(f"no {METHOD_NAMES[method]} run in sweep {sweep}: {purpose} not computed")
        return None
    if len(found) > 1:
        notes.add(f"{len(found)} {METHOD_NAMES[method]} variants in sweep {sweep}: {found[0].name} is the baseline")
    return found[0]


def _first(variants: Sequence[Variant], method: str) -> Variant | None:
    return next((v for v in variants if v.method == method), None)


def _span(values: Sequence[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}–{hi:{fmt}}"


def _reading(counts: Sequence[Counts], with_rounds: str, cells: Sequence[Cell] = (), family: int = 0,
             mde_cells: Sequence[Cell] = (), clones: bool = False) -> list[str]:
    """Caption sentences: the data behind a cell and how to read its interval, mark and bold
    (`cells`: every cell of the table; `family`: the Holm family's size; `mde_cells`: the Δτ vs DSpark
    cells whose minimum detectable effect the caption quotes)."""
    if not counts:
        return [f"No per-prompt logs (evaluation.json): gains are ratios of seed means without intervals, "
                f"and nothing is marked or bolded{with_rounds}."]
    dfs = [c.iv.df for c in cells if c.comparison and c.iv is not None]
    df = f" here {_span(dfs, '.1f')}" if dfs and all(map(math.isfinite, dfs)) else ""
    out = [
        f"Per cell: {count_text(counts)}.",
        "τ = 1 + Σ_j P_j, censored at the token budget; gains are paired by prompt and seed against the reference "
        "row and pool every suite's prompts; [lo, hi] is a closed-form 95 % interval, the seed level on seeds − 1 "
        f"degrees of freedom plus the prompt level on prompts − suites (effective df{df}; docs/sweeps.md).",
        f"{EFFECT_MARK} marks a comparison that stays significant (p < {stats.ALPHA:g}) after Holm's correction over "
        f"the table's {family} comparisons; bold: a row whose paired interval against every other row excludes 0 "
        "in its favour.",
    ]
    if any(c.thin for c in cells):
        out.append(f"(k of N differ): the two rows decode differently on fewer than {stats.MIN_DISCORDANT} seed × "
                   "prompt units, too few for an interval (an exact sign test reads them); never marked.")
    mdes = [c.iv.mde() for c in mde_cells if c.iv is not None and c.has_interval]
    if mdes:
        out.append(f"Smallest Δτ vs DSpark detectable at {stats.POWER * 100:.0f} % power: {_span(mdes, '.1f')} %.")
    if clones:
        out.append("A row labelled (= X: …) resolves to row X's drafter and repeats its numbers: "
                   "never marked or bolded.")
    return out


def _timing(ev: Evidence) -> str:
    at = (f" TPS is throughput: committed tokens per second with "
          f"{'/'.join(map(str, sorted(ev.concurrency)))} sequences decoded together (eval.concurrency)."
          if max(ev.concurrency, default=1) > 1 else "")
    if ev.on_cpu:
        return CPU_TIMING + "." + at
    if not ev.timing_ranked:
        return "Device not recorded: TPS is not ranked." + at
    return at.strip()


def _search_about(sweep: str, evaluations: Mapping[str, dict]) -> list[str]:
    """For a search sweep: the objective the trials were ranked on and the split it was computed on."""
    objective = collect.search_objective(sweep)
    if objective is None:
        return []
    held = [e.get(stats.HELDOUT_TF) for e in evaluations.values() if isinstance(e.get(stats.HELDOUT_TF), Mapping)]
    if objective.startswith(stats.HELDOUT_TF + "/"):
        splits = sorted({str(h.get("split")) for h in held if h.get("split")})
        sizes = sorted({int(h["num_sequences"]) for h in held if h.get("num_sequences") is not None})
        where = (f"the {'/'.join(splits)} split of held-out regenerated sequences"
                 + (f" ({'/'.join(map(str, sizes))} sequences)" if sizes else "")) if splits else \
            "held-out regenerated sequences (split not recorded in the runs)"
        return [f"Search objective {objective}: teacher-forced τ on {where}, not on the evaluation suites."]
    return [f"Search objective {objective}: computed on the evaluation suites themselves, "
            "so this table's numbers are not held out from the search."]


def ablation_table(sweep: str, runs: pl.DataFrame, spec: TableSpec,
                   evaluations: Mapping[str, dict] | None = None) -> Table:
    """Tables 2-6: DSpark (reference), the FT control, the placebo, then the ReaDy rows in `ready.order`.

    Columns: τ, Δτ vs DSpark and vs FT (%), state reliance (Δτ own − another prompt's states), TPS and
    ΔTPS vs DSpark (%). With per-prompt logs (`evaluations`: run id -> evaluation.json) τ and every
    comparison carry a 95 % interval over the seeds each row finished and the prompts (crossed), marks
    follow Holm over the table and bold the paired best row; without them, gains are ratios of seed
    means. Not-lossless runs are left out and footnoted; a row that is another row's drafter says so.
    """
    runs, aside = collect.set_aside_not_lossless(runs)
    evaluations = evaluations or {}
    ev = Evidence(runs, evaluations)
    variants = [v for v in collect.aggregate(runs) if v.method != "ar"]
    notes = _Notes()
    for p in ev.problems:
        notes.add(p)
    ref = _baseline(variants, "dspark", notes, sweep, "gains")
    ft, placebo = _first(variants, "ft"), _first(variants, "placebo")
    if ft is None:
        notes.add(f"no {METHOD_NAMES['ft']} run in sweep {sweep}: gains vs FT not computed")
    controls = [v for v in (ft, placebo) if v is not None]
    rest = [v for v in variants if v is not ref and v not in controls]
    ordered = ([ref] if ref is not None else []) + controls + rest
    any_evidence = any(ev.has(v) for v in ordered)

    def gain(v: Variant, r: Variant | None, metric: str) -> Cell:
        if r is None:
            return Cell("gain", decimals=GAIN_DECIMALS)
        if ev.has(v) and ev.has(r):
            iv, note = ev.gain(v, r, stats.OVERALL, metric)
            notes.add(note)
            return _interval_cell("gain", iv, GAIN_DECIMALS)
        cell = _gain(notes.stat(v, f"{SUMMARY}/{metric}"), notes.stat(r, f"{SUMMARY}/{metric}"))
        if any_evidence and cell.mean is not None:
            who = v.name if not ev.has(v) else r.name
            notes.add(f"{who}: no per-prompt logs (evaluation.json); its gains are ratios of seed means, no interval")
        return cell

    def reliance(v: Variant) -> Cell | None:
        iv = ev.state_reliance(v, stats.OVERALL)
        if iv is not None:
            return _interval_cell("diff", iv, DIFF_DECIMALS)
        logged = v.stat(f"{SUMMARY}/state_reliance")[0]
        return None if logged is None else Cell("diff", logged.mean, decimals=DIFF_DECIMALS)

    reliances = {v.variant_id: reliance(v) for v in ordered}
    if not any(reliances.values()):
        notes.add(f"no state-swap decode logged in sweep {sweep}: state reliance not computed")

    def reliance_cell(v: Variant) -> Cell:
        cell = reliances[v.variant_id]
        if cell is not None:
            return cell
        if v.method == "ready":  # expected: a ReaDy row decodes with swapped states too
            if any(reliances.values()) and v.n_finished:
                notes.add(f"{v.name}: no state-swap decode logged; state reliance not computed")
            return Cell("diff", decimals=DIFF_DECIMALS)
        return Cell("text", text="")

    rows: list[list[Cell]] = []
    counts: list[Counts] = []
    names = {v.variant_id: v.name for v in ordered}
    for v in ordered:
        c = ev.counts(v, stats.OVERALL)
        if c is not None:
            counts.append(c)
        tau_iv = ev.tau(v, stats.OVERALL)
        tau = _interval_cell("num", tau_iv, TAU_DECIMALS) if tau_iv else _num(notes.stat(v, f"{SUMMARY}/tau"), TAU_DECIMALS)
        label = ev.clone_label(v, names)
        row = [Cell("text", text=label, flag=NOT_LOSSLESS_MARK if v.variant_id in aside else ""), tau]
        row.append(Cell("gain", text="ref.") if v is ref else gain(v, ref, "tau"))
        row.append(Cell("gain", text="ref.") if v is ft else Cell("text", text="") if v is ref else gain(v, ft, "tau"))
        row.append(reliance_cell(v))
        row.append(_num(notes.stat(v, f"{SUMMARY}/tps"), 2))
        row.append(Cell("gain", text="ref.") if v is ref else _unranked(gain(v, ref, "tps"), ev.timing_ranked))
        if ev.clone_of(v) is not None:  # another row's drafter: its numbers repeat that row's
            for cell in row[1:]:
                cell.ranked = False
        rows.append(row)
    by_row = dict(zip((v.variant_id for v in ordered), rows))
    own = [v for v in ordered if v.n_finished and ev.clone_of(v) is None]
    best = best_row(own, lambda v: ev.point(v, stats.OVERALL), lambda a, b: ev.gain(a, b, stats.OVERALL)[0])
    if best is not None:
        for col in (1, 2, 3):
            by_row[best.variant_id][col].bold = True
    if ev.timing_ranked:
        best = best_row(own, lambda v: ev.point(v, stats.OVERALL, "tps"),
                        lambda a, b: ev.gain(a, b, stats.OVERALL, "tps")[0])
        if best is not None:
            for col in (5, 6):
                by_row[best.variant_id][col].bold = True
    if ref is None:  # keep the reference row visible, as a row of dashes
        rows.insert(0, [Cell("text", text="DSpark"), Cell(decimals=TAU_DECIMALS), Cell("gain"), Cell("text", text=""),
                        Cell("text", text=""), Cell(decimals=2), Cell("gain")])
    cells = [c for row in rows for c in row]
    family = apply_holm(cells)
    _seed_notes(variants, notes, aside)
    columns = [
        Column(spec.row_header, spec.row_header, align="l"),
        Column(r"$\tau$", "τ", group="Acceptance length"),
        Column(r"$\Delta\tau$ vs DSpark (\%)", "Δτ vs DSpark (%)", group="Acceptance length"),
        Column(r"$\Delta\tau$ vs FT (\%)", "Δτ vs FT (%)", group="Acceptance length"),
        Column("State reliance", "State reliance (Δτ)", group="Acceptance length"),
        Column("TPS", "TPS", group="Speed"),
        Column(r"$\Delta$TPS (\%)", "ΔTPS vs DSpark (%)", group="Speed"),
    ]
    rounds = ""
    if not any_evidence:
        r = [v.stats[f"{SUMMARY}/rounds"].mean for v in ordered if f"{SUMMARY}/rounds" in v.stats]
        rounds = f" ({min(r):,.0f}–{max(r):,.0f} rounds per seed)" if r else ""
    about = _reading(counts, rounds, cells, family, [r[2] for r in rows], bool(ev.clones))
    about += ["τ pooled over seeds and every suite's prompts (sums of the survival counts)"
              + ("" if any_evidence else " (mean ± std over seeds)") + "; TPS mean ± std over seeds.",
              "State reliance: τ with the row's own states minus τ with another prompt's states."]
    about += [t for t in (_timing(ev),) if t] + _search_about(sweep, evaluations) + _sampling_about(evaluations)
    notes.add(_tie_flip_note(evaluations))
    rule = {1} if len(rows) > 1 else set()
    if controls and rest:
        rule.add(1 + len(controls))
    return Table(spec, sweep, collect.models(runs), collect.seed_counts(variants), columns, rows,
                 rule_before=rule, notes=notes.items, lossless_notes=_lossless_notes(variants, aside), about=about)


def with_pooled(runs: pl.DataFrame, evaluations: Mapping[str, dict], benches: Sequence[str]) -> pl.DataFrame:
    """Per run, τ of every benchmark and `_pooled/tau`, `_pooled/tps` (every suite's prompts pooled, as
    `reports.stats` pools `overall`) recomputed from the run's evaluation.json by today's rule
    (`ready.metrics`), so a store written by older code reads the same; without one, the logged
    `<b>/tau` and `overall/<m>`. `_pooled` is null for a run that misses a benchmark."""
    tallied: list[stats.RunTallies | None] = []
    for r in runs.iter_rows(named=True):
        run = None
        if evaluations.get(r["run_id"]) is not None:
            try:
                run = stats.tallies(evaluations[r["run_id"]])
            except stats.StatsError:
                run = None
        tallied.append(run if run is not None and run.benchmarks else None)
    columns = []
    for b in benches:
        if f"{b}/tau" in runs.columns:
            logged = runs[f"{b}/tau"].to_list()
            fresh = [stats.point([t], b) if t is not None and b in t.benchmarks else None for t in tallied]
            columns.append(pl.Series(f"{b}/tau", [f if f is not None else x for f, x in zip(fresh, logged)],
                                     dtype=pl.Float64))
    values: dict[str, list[float | None]] = {"tau": [], "tps": []}
    for r, run in zip(runs.iter_rows(named=True), tallied):
        complete = all(r.get(f"{b}/{m}") is not None for b in benches for m in values)
        for m in values:
            point = stats.point([run], stats.OVERALL, m) if run is not None else None
            values[m].append((point if point is not None else r.get(f"{SUMMARY}/{m}")) if complete else None)
    columns += [pl.Series(f"{POOLED}/{m}", v, dtype=pl.Float64) for m, v in values.items()]
    return runs.with_columns(columns)


def _tps_tau(v: Variant | None, bench: str, notes: _Notes) -> tuple[Stat | None, Stat | None]:
    """A variant's TPS and tau on one benchmark (None for an absent variant or missing metric)."""
    if v is None:
        return None, None
    if bench == POOLED:  # the pooled row's note names the cause (a missing benchmark), added below
        return v.stat(f"{bench}/tps")[0], v.stat(f"{bench}/tau")[0]
    return notes.stat(v, f"{bench}/tps"), notes.stat(v, f"{bench}/tau")


def main_table(sweep: str, runs: pl.DataFrame, spec: TableSpec,
               evaluations: Mapping[str, dict] | None = None) -> Table:
    """Table 1: per benchmark and all prompts pooled, TPS / speedup vs AR / tau for each method, gains vs DSpark.

    Column groups are AR, DSpark, then every other variant in `ready.order`; the gain columns
    compare each non-baseline variant with DSpark, paired by prompt and seed with a 95 % interval
    when the runs' evaluation.json are given. The last row pools every suite's prompts (ratio of
    sums per run, then mean over seeds), the one pooling its gains use (the paper's "Average" is a
    mean over benchmarks instead); it is missing when any benchmark is. Bold per benchmark: the
    method (DSpark or another row) whose paired τ (TPS on CUDA) beats every other method's.
    """
    runs, aside = collect.set_aside_not_lossless(runs)
    evaluations = evaluations or {}
    ev = Evidence(runs, evaluations)
    benches = collect.benchmarks(runs, "tps")
    runs = with_pooled(runs, evaluations, benches)
    variants = collect.aggregate(runs)
    notes = _Notes()
    for p in ev.problems:
        notes.add(p)
    ar = _baseline(variants, "ar", notes, sweep, "speedups")
    ds = _baseline(variants, "dspark", notes, sweep, "gains")
    others = [v for v in variants if v is not ar and v is not ds]
    groups: list[Variant | None] = [ar, ds, *others]

    def name(v: Variant | None, default: str) -> str:
        return (v.name + (NOT_LOSSLESS_MARK if v.variant_id in aside else "")) if v else default

    group_names = [name(ar, "AR"), name(ds, "DSpark"), *(name(v, "") for v in others)]
    columns = [Column("Benchmark", "Benchmark", align="l")]
    for gname in group_names:
        columns += [Column("TPS", f"{gname} TPS", gname), Column(r"$\times$", f"{gname} ×", gname),
                    Column(r"$\tau$", f"{gname} τ", gname)]
    for v, gname in zip(others, group_names[2:]):
        gain = "Gain vs DSpark" if len(others) == 1 else f"{gname} vs DSpark"
        columns += [Column(r"TPS (\%)", f"{gain} TPS (%)", gain), Column(r"$\tau$ (\%)", f"{gain} τ (%)", gain)]

    def paired(v: Variant, key: str, metric: str, a: Stat | None, b: Stat | None) -> Cell:
        if ds is not None and ev.has(v) and ev.has(ds):
            iv, note = ev.gain(v, ds, key, metric)
            notes.add(note)
            return _interval_cell("gain", iv, GAIN_DECIMALS)
        return _gain(a, b)

    rows: list[list[Cell]] = []
    counts: list[Counts] = []
    methods = [v for v in (ds, *others) if v is not None and v.n_finished]
    for b in [*benches, POOLED]:
        key = stats.OVERALL if b == POOLED else b
        counts += [c for v in groups if v is not None and v.method != "ar" for c in [ev.counts(v, key)] if c]
        st = [_tps_tau(v, b, notes) for v in groups]
        ar_tps, (ds_tps, ds_tau) = st[0][0], st[1]
        tps_cells = [_num(tps, 2) for tps, _ in st]
        x_cells = [Cell("speedup", _ratio(tps, ar_tps), decimals=2) for tps, _ in st]
        tau_cells = [_num(tau, 2) for _, tau in st]
        gain_tps = [_unranked(paired(v, key, "tps", tps, ds_tps), ev.timing_ranked) for v, (tps, _) in zip(others, st[2:])]
        gain_tau = [paired(v, key, "tau", tau, ds_tau) for v, (_, tau) in zip(others, st[2:])]
        for metric, col, gains in (("tau", tau_cells, gain_tau), ("tps", tps_cells, gain_tps)):
            if metric == "tps" and not ev.timing_ranked:
                continue
            best = best_row(methods, lambda v: ev.point(v, key, metric),
                            lambda a, o: ev.gain(a, o, key, metric)[0])
            if best is not None:
                col[groups.index(best)].bold = True
                if best is not ds:
                    gains[others.index(best)].bold = True
        row = [Cell("text", text=BENCHMARK_NAMES.get(b, b))]
        for group in zip(tps_cells, x_cells, tau_cells):
            row += group
        for pair in zip(gain_tps, gain_tau):
            row += pair
        rows.append(row)
    if not benches:
        notes.add(f"no benchmark metrics (<benchmark>/tps) in sweep {sweep}")
    for v in groups:
        if v is not None and v.n_finished and any(v.stat(f"{b}/{m}")[0] is None for b in benches for m in ("tps", "tau")):
            notes.add(f"{v.name}: All prompts needs every benchmark")
    _seed_notes(variants, notes, aside)
    cells = [c for row in rows for c in row]
    family = apply_holm(cells)
    first_gain = 1 + 3 * len(groups)
    about = _reading(counts, "", cells, family, [r[first_gain + 2 * k + 1] for r in rows for k in range(len(others))])
    about += ["TPS and τ per method: mean ± std over seeds; × is TPS over AR's; All prompts pools every suite's "
              "prompts (ratio of sums), not the mean over benchmarks."]
    about += [t for t in (_timing(ev),) if t] + _sampling_about(evaluations)
    notes.add(_tie_flip_note(evaluations))
    return Table(spec, sweep, collect.models(runs), collect.seed_counts(variants), columns, rows,
                 rule_before={len(rows) - 1} if len(rows) > 1 else set(), notes=notes.items,
                 lossless_notes=_lossless_notes(variants, aside), about=about)


def build_table(sweep: str, runs: pl.DataFrame, evaluations: Mapping[str, dict] | None = None) -> Table:
    """The table of one sweep, in the layout its spec names (`evaluations`: run id -> evaluation.json)."""
    spec = spec_for(sweep, runs)
    build = main_table if spec.layout == "main" else ablation_table
    return build(sweep, runs, spec, evaluations)


def seeds_text(seeds: tuple[int, int]) -> str:
    lo, hi = seeds
    n = f"{hi}" if lo == hi else f"{lo}–{hi}"
    return f"{n} seed" + ("" if hi == 1 else "s")


def caption_text(table: Table) -> list[str]:
    """The caption after the title and the sweep/model line, as sentences (LaTeX and Markdown alike)."""
    return list(table.about)
