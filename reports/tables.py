"""The paper's tables as data: which sweep feeds which table, and the cells computed from runs.

A `Table` holds numbers, not strings; `reports.latex` and `reports.markdown` render it. Gains and
speedups are recomputed here from the baseline runs of the same sweep (ratio of seed means),
never read from the gains the runner logged. A value that cannot be computed is a missing cell
(rendered as a dash) plus a note saying why, never a zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

import polars as pl

from reports import collect
from reports.collect import METHOD_NAMES, Stat, Variant

SUMMARY = "overall"  # the benchmark key of the whole-suite metrics the ablation tables report
AVERAGE = "_average"  # per-run mean over benchmarks, added for Table 1's last row


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
    AVERAGE: "Average",
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
    """One table cell. kind: text | num (mean ± std) | gain (signed %) | speedup (×)."""

    kind: str = "num"
    mean: float | None = None
    std: float | None = None
    decimals: int = 2
    text: str = ""
    bold: bool = False

    @property
    def missing(self) -> bool:
        return self.kind != "text" and self.mean is None and not self.text


@dataclass
class Table:
    spec: TableSpec
    sweep: str
    models: list[str]
    seeds: tuple[int, int]  # (min, max) finished seeds per variant
    columns: list[Column]
    rows: list[list[Cell]]
    rule_before: set[int] = field(default_factory=set)  # row indices preceded by a \midrule
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"tab:ready-{self.sweep}"


def format_number(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def format_cell_parts(cell: Cell) -> tuple[str, str | None]:
    """(value, std) strings of a numeric cell; std None when there is one seed or none applies."""
    assert cell.mean is not None
    if cell.kind == "gain":
        return f"{cell.mean:+.{cell.decimals}f}", None
    val = format_number(cell.mean, cell.decimals)
    std = format_number(cell.std, cell.decimals) if cell.std is not None else None
    return val, std


def mark_best(cells: Sequence[Cell]) -> None:
    """Bold the highest value among two or more present cells (ties at display precision all bold)."""
    present = [c for c in cells if c.mean is not None]
    if len(present) < 2:
        return
    best = max(round(c.mean, c.decimals) for c in present)
    for c in present:
        c.bold = round(c.mean, c.decimals) == best


def _num(stat: Stat | None, decimals: int) -> Cell:
    if stat is None:
        return Cell("num", decimals=decimals)
    return Cell("num", stat.mean, stat.std if stat.n > 1 else None, decimals)


def _ratio(a: Stat | None, b: Stat | None) -> float | None:
    if a is None or b is None or b.mean == 0:
        return None
    return a.mean / b.mean


def _gain(a: Stat | None, b: Stat | None) -> Cell:
    r = _ratio(a, b)
    return Cell("gain", None if r is None else 100.0 * (r - 1.0), decimals=2)


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


def _seed_notes(variants: Sequence[Variant], notes: _Notes) -> None:
    for v in variants:
        if v.missing_seeds:
            ms = ", ".join(str(s) for s in v.missing_seeds)
            have = ", ".join(str(s) for s in v.seeds)
            notes.add(f"{v.name}: mean over seed(s) {have} only; no finished run for seed(s) {ms}")


def _baseline(variants: Sequence[Variant], method: str, notes: _Notes, sweep: str, purpose: str) -> Variant | None:
    found = [v for v in variants if v.method == method]
    if not found:
        notes.add(f"no {METHOD_NAMES[method]} run in sweep {sweep}: {purpose} not computed")
        return None
    if len(found) > 1:
        notes.add(f"{len(found)} {METHOD_NAMES[method]} variants in sweep {sweep}: {found[0].name} is the baseline")
    return found[0]


def ablation_table(sweep: str, runs: pl.DataFrame, spec: TableSpec) -> Table:
    """Tables 2-6: one row per variant in `ready.order`, tau, TPS and their gains vs DSpark (%).

    The DSpark run of the same sweep is the first (reference) row; AR runs are not shown.
    """
    variants = [v for v in collect.aggregate(runs) if v.method != "ar"]
    notes = _Notes()
    ref = _baseline(variants, "dspark", notes, sweep, "gains")
    others = [v for v in variants if v is not ref]
    tau_m, tps_m = f"{SUMMARY}/tau", f"{SUMMARY}/tps"
    rows: list[list[Cell]] = []
    ordered = ([ref] if ref is not None else []) + others
    ref_tau = ref_tps = None
    if ref is not None:
        ref_tau, ref_tps = notes.stat(ref, tau_m), notes.stat(ref, tps_m)
    for v in ordered:
        tau, tps = notes.stat(v, tau_m), notes.stat(v, tps_m)
        row = [Cell("text", text=v.name), _num(tau, 4), _num(tps, 2)]
        if v is ref:
            row += [Cell("gain", text="ref."), Cell("gain", text="ref.")]
        else:
            row += [_gain(tau, ref_tau), _gain(tps, ref_tps)]
        rows.append(row)
    if ref is None:  # keep the reference row visible, as a row of dashes
        rows.insert(0, [Cell("text", text="DSpark"), Cell(decimals=4), Cell(decimals=2), Cell("gain"), Cell("gain")])
    for col in range(1, 5):
        mark_best([r[col] for r in rows])
    _seed_notes(variants, notes)
    columns = [
        Column(spec.row_header, spec.row_header, align="l"),
        Column(r"$\tau$", "τ"),
        Column("TPS", "TPS"),
        Column(r"$\Delta\tau$ (\%)", "Δτ vs DSpark (%)", group="Gain vs DSpark"),
        Column(r"$\Delta$TPS (\%)", "ΔTPS vs DSpark (%)", group="Gain vs DSpark"),
    ]
    return Table(spec, sweep, collect.models(runs), collect.seed_counts(variants), columns, rows,
                 rule_before={1} if len(rows) > 1 else set(), notes=notes.items)


def _tps_tau(v: Variant | None, bench: str, notes: _Notes) -> tuple[Stat | None, Stat | None]:
    """A variant's TPS and tau on one benchmark (None for an absent variant or missing metric)."""
    if v is None:
        return None, None
    if bench == AVERAGE:  # the average row's note names the cause (a missing benchmark), added below
        return v.stat(f"{bench}/tps")[0], v.stat(f"{bench}/tau")[0]
    return notes.stat(v, f"{bench}/tps"), notes.stat(v, f"{bench}/tau")


def main_table(sweep: str, runs: pl.DataFrame, spec: TableSpec) -> Table:
    """Table 1: per benchmark and their average, TPS / speedup vs AR / tau for each method, gains vs DSpark.

    Column groups are AR, DSpark, then every other variant in `ready.order`; the gain columns
    compare each non-baseline variant with DSpark. The average row is the mean over benchmarks
    (per run, then over seeds), as in the paper; it is missing when any benchmark is.
    """
    benches = collect.benchmarks(runs, "tps")
    for metric in ("tps", "tau"):
        runs = collect.with_mean_over(runs, f"{AVERAGE}/{metric}", [f"{b}/{metric}" for b in benches])
    variants = collect.aggregate(runs)
    notes = _Notes()
    ar = _baseline(variants, "ar", notes, sweep, "speedups")
    ds = _baseline(variants, "dspark", notes, sweep, "gains")
    others = [v for v in variants if v is not ar and v is not ds]
    groups: list[Variant | None] = [ar, ds, *others]
    group_names = [ar.name if ar else "AR", ds.name if ds else "DSpark", *(v.name for v in others)]
    columns = [Column("Benchmark", "Benchmark", align="l")]
    for name in group_names:
        columns += [Column("TPS", f"{name} TPS", name), Column(r"$\times$", f"{name} ×", name),
                    Column(r"$\tau$", f"{name} τ", name)]
    for v in others:
        gain = "Gain vs DSpark" if len(others) == 1 else f"{v.name} vs DSpark"
        columns += [Column(r"TPS (\%)", f"{gain} TPS (%)", gain), Column(r"$\tau$ (\%)", f"{gain} τ (%)", gain)]

    rows: list[list[Cell]] = []
    for b in [*benches, AVERAGE]:
        stats = [_tps_tau(v, b, notes) for v in groups]
        ar_tps, (ds_tps, ds_tau) = stats[0][0], stats[1]
        tps_cells = [_num(tps, 2) for tps, _ in stats]
        x_cells = [Cell("speedup", _ratio(tps, ar_tps), decimals=2) for tps, _ in stats]
        tau_cells = [_num(tau, 2) for _, tau in stats]
        gain_tps = [_gain(tps, ds_tps) for tps, _ in stats[2:]]
        gain_tau = [_gain(tau, ds_tau) for _, tau in stats[2:]]
        for cells in (tps_cells, x_cells, tau_cells, gain_tps, gain_tau):
            mark_best(cells)
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
            notes.add(f"{v.name}: Average needs every benchmark")
    _seed_notes(variants, notes)
    return Table(spec, sweep, collect.models(runs), collect.seed_counts(variants), columns, rows,
                 rule_before={len(rows) - 1} if len(rows) > 1 else set(), notes=notes.items)


def build_table(sweep: str, runs: pl.DataFrame) -> Table:
    """The table of one sweep, in the layout its spec names."""
    spec = spec_for(sweep, runs)
    return main_table(sweep, runs, spec) if spec.layout == "main" else ablation_table(sweep, runs, spec)


def seeds_text(seeds: tuple[int, int]) -> str:
    lo, hi = seeds
    n = f"{hi}" if lo == hi else f"{lo}–{hi}"
    return f"{n} seed" + ("" if hi == 1 else "s")
