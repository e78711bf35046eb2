"""Decode TPS against `eval.concurrency`: one line per row of a sweep that was evaluated at several.

A sweep evaluated at several concurrencies holds one sweep setting per concurrency (`eval.concurrency`
is part of the common config, so `python -m sweeps.run rank eval.concurrency=4` starts a new setting
beside the one at 1). The tables report only the newest setting (`collect.latest_setting`); this
figure takes every setting whose resolved config (the runs' params) equals the newest one's except for
`eval.concurrency`, and for each concurrency the newest such setting that ran it. A run logged before
the key existed counts as concurrency 1. A setting that differs in anything else (a smoke run, other
budgets) is left out and said so. Each point is `overall/tps` of a row, mean ± std over its finished,
lossless seeds (`collect.aggregate`). Nothing is drawn when the sweep ran a single concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import polars as pl

from reports import collect
from reports.figures import save_figure

KEY = collect.CONCURRENCY_KEY
METRIC = "overall/tps"
# params that may differ between the settings of one figure: the concurrency itself, and what never
# changes a result (sweeps.spec._NEVER_HASHED) or differs per row and seed anyway
IGNORED = {KEY, *(collect.PARAM_PREFIX + k
                  for k in ("seed", "name", "artifacts_dir", "train.devices", "train.micro_batch_size"))}
CPU_NOTE = "CPU timing, indicative only"
UNKNOWN_DEVICE_NOTE = "device not recorded: timing indicative only"


@dataclass(frozen=True)
class Point:
    concurrency: int
    mean: float
    std: float | None  # sample std over seeds; None with one seed
    n: int  # seeds
    setting: str | None


@dataclass(frozen=True)
class Line:
    method: str
    label: str
    points: tuple[Point, ...]


@dataclass
class TpsFigure:
    """The figure's data: lines in row order, the concurrencies drawn, the run ids behind the points."""

    concurrencies: tuple[int, ...]
    lines: list[Line]
    run_ids: list[str]
    notes: list[str] = field(default_factory=list)  # settings left out, points missing


def _groups(runs: pl.DataFrame) -> pl.DataFrame:
    """Column `group`: the run's sweep setting, as `collect.latest_setting` sees settings (with fewer
    than two tagged settings, every run belongs to the one group)."""
    settings = runs["ready.setting"].drop_nulls().unique()
    group = pl.col("ready.setting").fill_null("") if len(settings) >= 2 else pl.lit("")
    return runs.with_columns(group.alias("group"))


def _differences(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """Keys both settings fix to different values (keys one of them lacks, newer than its runs, pass)."""
    return sorted(k[len(collect.PARAM_PREFIX):] for k in set(a) & set(b) if a[k] != b[k])


def tps_by_concurrency(runs: pl.DataFrame) -> TpsFigure | None:
    """The lines of the TPS-vs-concurrency figure from every run of one sweep (all its settings);
    None when the settings that may share the figure ran fewer than two concurrencies."""
    if runs.height == 0:
        return None
    runs, _aside = collect.set_aside_not_lossless(_groups(collect.with_concurrency(runs)))
    # oldest to newest by their latest run; untagged runs beside tagged settings count as the oldest
    last = runs.group_by("group").agg(pl.col("start_time").max()).sort([pl.col("group") != "", "start_time"],
                                                                        nulls_last=False)
    newest = last["group"].to_list()
    if len(runs.filter(pl.col("status") == collect.FINISHED)["concurrency"].unique()) < 2:
        return None
    reference = collect.common_params(runs.filter(pl.col("group") == newest[-1]), IGNORED)
    notes: list[str] = []
    chosen: dict[int, str] = {}  # concurrency -> the newest compatible setting that ran it
    for group in reversed(newest):
        part = runs.filter(pl.col("group") == group)
        ran = sorted(set(part.filter(pl.col("status") == collect.FINISHED)["concurrency"].to_list()) - set(chosen))
        if not ran:
            continue
        diff = _differences(reference, collect.common_params(part, IGNORED))
        if diff:
            shown = ", ".join(diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")
            notes.append(f"setting {group or '(untagged)'} (concurrency {', '.join(map(str, ran))}) left out: "
                         f"it differs from the reported setting in {shown}")
            continue
        chosen.update(dict.fromkeys(ran, group))
    if len(chosen) < 2:
        return None
    points: dict[tuple[str, str], list[Point]] = {}
    order: dict[tuple[str, str], float] = {}
    run_ids: list[str] = []
    for c, group in sorted(chosen.items()):
        part = runs.filter((pl.col("group") == group) & (pl.col("concurrency") == c))
        run_ids += collect.finished(part)["run_id"].to_list()
        for v in collect.aggregate(part):
            key = (v.method, v.name)
            if v.order is not None:
                order[key] = min(order.get(key, v.order), v.order)
            stat, why = v.stat(METRIC)
            if stat is None:
                notes.append(f"concurrency {c}: {why}")
                continue
            points.setdefault(key, []).append(Point(c, stat.mean, stat.std if stat.n > 1 else None, stat.n, group or None))
    big = float(1 << 62)
    keys = sorted(points, key=lambda k: (order.get(k, big), k[1]))
    lines = [Line(m, label, tuple(points[m, label])) for m, label in keys]
    drawn = tuple(sorted({p.concurrency for line in lines for p in line.points}))
    if len(drawn) < 2:
        return None
    return TpsFigure(drawn, lines, run_ids, notes)


def devices_in_params(runs: pl.DataFrame) -> bool:
    """Every run names cpu or cuda in param `target.device` (else its evaluation.json says where it ran)."""
    col = collect.PARAM_PREFIX + "target.device"
    return col in runs.columns and all(str(d) in ("cpu", "cuda") for d in runs[col].to_list())


def devices(runs: pl.DataFrame, evaluations: Mapping[str, dict]) -> set[str]:
    """Where the runs were timed: param `target.device` when cpu/cuda, else evaluation.json's
    `resolved.device` (the same sources as the tables' `Evidence`)."""
    found: set[str] = set()
    for r in runs.iter_rows(named=True):
        d = r.get(collect.PARAM_PREFIX + "target.device")
        if str(d) not in ("cpu", "cuda"):
            d = ((evaluations.get(r["run_id"]) or {}).get("resolved") or {}).get("device")
        if d:
            found.add(str(d))
    return found


def timing_note(found: set[str]) -> str:
    """The caption's word on the timing, as the tables mark CPU TPS (`tables.CPU_TIMING`)."""
    if "cpu" in found:
        return CPU_NOTE
    if found != {"cuda"}:
        return UNKNOWN_DEVICE_NOTE
    return ""


def plot_tps(fig_data: TpsFigure, title: str, out_stem: Path) -> list[Path]:
    """One panel: decode TPS against concurrency (log2 axis), a line per row with ± std bars over
    seeds; write `<stem>.pdf` and `<stem>.png` atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fixed = {"ar": dict(color="0.3", linestyle=":", marker="^"), "dspark": dict(color="0.5", linestyle="--", marker="s")}
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4)
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for line in fig_data.lines:
        style = fixed.get(line.method) or dict(color=next(colors), linestyle="-", marker="o")
        xs = [p.concurrency for p in line.points]
        ys = [p.mean for p in line.points]
        errs = [p.std or 0.0 for p in line.points]
        ax.errorbar(xs, ys, yerr=errs if any(errs) else None, label=line.label, markersize=4, capsize=2, **style)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(fig_data.concurrencies)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in fig_data.concurrencies])
    ax.set_xlabel("Concurrency (eval.concurrency)")
    ax.set_ylabel("Decode TPS (overall)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_stem)
