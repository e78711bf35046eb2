"""`python -m reports.calibration`: DSpark and ReaDy under both verify schedules, and how well the
confidence head that schedules them is calibrated.

    python -m reports.calibration                     # sweep verify_schedule in sqlite:///mlflow.db
    python -m reports.calibration --sweep verify_schedule --out reports/out

A sweep with the axis `eval.verify_schedule` (experiments/verify_schedule.yaml) holds one setting per
schedule; runs from before the key count as `full`. As `reports.concurrency` does, this takes for each
schedule the newest setting whose common config equals the newest setting's except for the schedule's
keys (eval.verify_schedule, eval.confidence_threshold, eval.verify_budget); a setting that differs in
anything else is left out and said so. Per drafting method (DSpark, ReaDy) and schedule, over the finished,
lossless seeds' evaluation.json:

- τ, tokens verified per round (drafts verified + the anchor; `ready.calibration`) and TPS, pooled over every
  suite's prompts and the seeds, with 95 % intervals from the crossed bootstrap (`reports.stats`);
- the confidence schedule against the full one, paired prompt by prompt and seed by seed (the two settings
  decode the same prompts with the same drafters): Δτ %, Δ tokens verified per round %, ΔTPS % with
  intervals (TPS on CPU is indicative, never ranked);
- the head's calibration pooled over the row's rounds: ECE (DeepSpec's 20 bins, positions weighted by
  their counts) and ECE per draft position; under the confidence schedule only the positions a row
  verified are observed (a selected sample: the full schedule's ECE is the head's calibration as such);
- what DSpark's sequential temperature scaling (`ready.calibration.fit_sts`) would make of it: the
  temperatures fitted on the even-numbered prompt records and the ECE on the odd ones before and after
  (the decoding itself still reads the raw confidences).

Writes `calibration_<sweep>.md` (the table) and `fig_calibration_<sweep>.pdf/.png` (reliability diagrams:
one panel per draft position, observed against predicted prefix acceptance, one line per row).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import polars as pl

from ready.artifacts import atomic_write_text
from ready.calibration import calibration, rounds_of, sts_holdout
from ready.config import entry_point
from reports import stats
from reports import collect
from reports.errors import ReportError
from reports.figures import save_figure

SWEEP = "verify_schedule"
KEY = collect.PARAM_PREFIX + "eval.verify_schedule"
SCHEDULE_KEYS = {KEY, collect.PARAM_PREFIX + "eval.confidence_threshold", collect.PARAM_PREFIX + "eval.verify_budget"}
# params that may differ between the settings of one table: the schedule's, and what never changes a result
IGNORED = SCHEDULE_KEYS | {collect.PARAM_PREFIX + k for k in ("seed", "name", "artifacts_dir", "train.devices",
                                                               "train.micro_batch_size", "train.base_seed")}
SCHEDULES = ("full", "confidence")
METHODS = {"dspark": "DSpark", "ready": "ReaDy"}
STEM = "calibration_{sweep}"
FIGURE_STEM = "fig_calibration_{sweep}"


@dataclass
class Row:
    """One drafting method under one schedule (its finished, lossless seeds pooled)."""

    method: str
    schedule: str
    seeds: tuple[int, ...]
    setting: str
    tau: Optional[stats.Interval] = None
    verified: Optional[stats.Interval] = None  # tokens verified per round
    tps: Optional[stats.Interval] = None
    calibration: Optional[dict] = None  # `ready.calibration.calibration` over every seed's rounds
    sts: Optional[dict] = None  # `ready.calibration.sts_holdout`: STS fitted on even prompts, scored on odd
    vs_full: dict[str, Optional[stats.Interval]] = field(default_factory=dict)  # tau, verified, tps: % vs full
    device: Optional[str] = None

    @property
    def label(self) -> str:
        return f"{METHODS.get(self.method, self.method)}, {self.schedule}"


@dataclass
class Report:
    sweep: str
    rows: list[Row]
    notes: list[str]
    settings: dict[str, str]  # schedule -> setting


def schedule_settings(runs: pl.DataFrame) -> tuple[dict[str, str], list[str]]:
    """schedule -> the newest compatible setting that ran it (module docstring), and what was left out."""
    if runs.height == 0:
        return {}, []
    sched = pl.col(KEY).cast(pl.Utf8).fill_null("full") if KEY in runs.columns else pl.lit("full")
    runs = runs.with_columns(sched.alias("schedule"), pl.col("ready.setting").fill_null("").alias("group"))
    last = runs.group_by("group").agg(pl.col("start_time").max()).sort("start_time", nulls_last=False)
    newest = last["group"].to_list()
    reference = collect.common_params(runs.filter(pl.col("group") == newest[-1]), IGNORED)
    chosen: dict[str, str] = {}
    notes: list[str] = []
    for group in reversed(newest):
        part = runs.filter((pl.col("group") == group) & (pl.col("status") == collect.FINISHED))
        ran = sorted(set(part["schedule"].to_list()) - set(chosen))
        if not ran:
            continue
        mine = collect.common_params(part, IGNORED)
        diff = sorted(k[len(collect.PARAM_PREFIX):] for k in set(reference) & set(mine) if reference[k] != mine[k])
        if diff:
            notes.append(f"setting {group or '(untagged)'} ({', '.join(ran)}) left out: it differs from the newest "
                         f"setting in {', '.join(diff[:4])}" + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else ""))
            continue
        chosen.update(dict.fromkeys(ran, group))
    return chosen, notes


def _per_prompt_verified(evaluation: Mapping, bench: str) -> dict[int, tuple[float, float]]:
    """Prompt index -> (tokens verified, rounds) of one benchmark of a run (samples of a prompt pooled)."""
    out: dict[int, tuple[float, float]] = {}
    for i, rec in enumerate((evaluation.get("benchmarks") or {}).get(bench, {}).get("prompts") or []):
        ver = rec.get("verified") or []
        key = int(rec.get("index", i))
        a, b = out.get(key, (0.0, 0.0))
        out[key] = (a + sum(int(n) + 1 for n in ver), b + len(ver))
    return out


def verified_design(a: Sequence[Mapping], b: Optional[Sequence[Mapping]] = None) -> Optional[stats.Design]:
    """The crossed (seed, prompt) table of tokens verified and rounds of row A (and, paired seed by seed,
    row B's after them), every suite's prompts, each seed in seed 0's prompt order; None when a run has no
    verification records; StatsError when runs decoded different prompts."""
    benches = sorted(set.intersection(*[set(e.get("benchmarks") or {}) for e in [*a, *(b or [])]])) if a else []
    if not benches:
        return None
    seeds, strata = [], None
    for s, ea in enumerate(a):
        blocks, strata_s = [], []
        for k, bench in enumerate(benches):
            pa = _per_prompt_verified(ea, bench)
            order = sorted(_per_prompt_verified(a[0], bench))
            cols = [[pa[i][0], pa[i][1]] if i in pa else None for i in order]
            if b is not None:
                pb = _per_prompt_verified(b[s], bench)
                if set(pb) != set(pa):
                    raise stats.StatsError(f"{bench} (pair {s}): the two schedules' runs decoded different prompts")
                cols = [c + [pb[i][0], pb[i][1]] for c, i in zip(cols, order)]
            if any(c is None for c in cols):
                raise stats.StatsError(f"{bench} (seed {s}): the seeds decoded different prompts")
            blocks += cols
            strata_s += [k] * len(order)
        seeds.append(blocks)
        strata = np.asarray(strata_s)
    x = np.asarray(seeds, dtype=float)
    if not (x[..., 1] > 0).any():
        return None
    return stats.Design(x, strata, (2,) if b is None else (2, 2))


def _gain(t: np.ndarray) -> np.ndarray:
    return 100.0 * (stats.pooled(t, 0, 1) / stats.pooled(t, 2, 3) - 1.0)


def _first(values: list[Optional[stats.Interval]]) -> Optional[stats.Interval]:
    return values[0] if values else None


def build(runs: pl.DataFrame, evaluations: Mapping[str, dict], sweep: str = SWEEP) -> Report:
    """The table's rows (module docstring) from every run of a sweep (all its settings) and their
    evaluation.json (run id -> dict)."""
    settings, notes = schedule_settings(runs)
    by: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for schedule, group in settings.items():
        part = runs.filter(pl.col("ready.setting").fill_null("") == group)
        part = part.with_columns((pl.col(KEY).cast(pl.Utf8).fill_null("full") if KEY in part.columns
                                  else pl.lit("full")).alias("schedule"))
        part, aside = collect.set_aside_not_lossless(part.filter(pl.col("schedule") == schedule))
        part = collect.finished(part)
        for name, seeds in aside.items():
            notes.append(f"variant {name} ({schedule}): seeds {', '.join(map(str, seeds))} not lossless, left out")
        for r in part.iter_rows(named=True):
            method = (r.get("ready.method") or "").lower()
            if method not in METHODS or r["run_id"] not in evaluations:
                continue
            seed = int(r.get("ready.seed") or 0)
            by.setdefault((method, schedule), []).append((seed, evaluations[r["run_id"]]))
    rows: list[Row] = []
    for method in METHODS:
        for schedule in SCHEDULES:
            got = sorted(by.get((method, schedule), []), key=lambda p: p[0])
            if not got:
                continue
            seeds = tuple(s for s, _ in got)
            evals = [e for _, e in got]
            runs_t = [stats.tallies(e) for e in evals]
            row = Row(method, schedule, seeds, settings[schedule], device=runs_t[0].device)
            row.tau, row.tps = stats.tau(runs_t, stats.OVERALL), stats.tps(runs_t, stats.OVERALL)
            d = verified_design(evals)
            row.verified = None if d is None else _first(stats.estimate(d, lambda t: stats.pooled(t, 0, 1)))
            k = next((b["metrics"]["proposals"] for e in evals for b in (e.get("benchmarks") or {}).values()
                      if (b.get("metrics") or {}).get("proposals")), 0)
            recs = [p for e in evals for b in (e.get("benchmarks") or {}).values() for p in (b.get("prompts") or [])]
            row.calibration = calibration(rounds_of(recs), k)
            row.sts = sts_holdout(recs, k)
            rows.append(row)
    for row in rows:  # the confidence schedule against the full one, paired seed by seed and prompt by prompt
        if row.schedule == "full":
            continue
        full = dict(by.get((row.method, "full"), []))
        mine = dict(by.get((row.method, row.schedule), []))
        common = sorted(set(full) & set(mine))
        if not common:
            notes.append(f"{row.label}: no seed of the full schedule to pair with")
            continue
        a = [stats.tallies(mine[s]) for s in common]
        b = [stats.tallies(full[s]) for s in common]
        try:
            row.vs_full["tau"] = stats.gain_pct(a, b, stats.OVERALL, "tau")
            row.vs_full["tps"] = stats.gain_pct(a, b, stats.OVERALL, "tps")
            d = verified_design([mine[s] for s in common], [full[s] for s in common])
            row.vs_full["verified"] = None if d is None else _first(stats.estimate(d, _gain, paired=True, row=stats.pooled))
        except stats.StatsError as e:
            notes.append(f"{row.label}: not paired with the full schedule ({e})")
    return Report(sweep, rows, notes, settings)


def _fmt(iv: Optional[stats.Interval], digits: int = 2, signed: bool = False) -> str:
    if iv is None or not math.isfinite(iv.value):
        return "—"
    sign = "+" if signed else ""
    return f"{iv.value:{sign}.{digits}f} [{iv.lo:{sign}.{digits}f}, {iv.hi:{sign}.{digits}f}]"


def render(report: Report) -> str:
    """The Markdown table with its caption and notes."""
    k = max((len(r.calibration["positions"]) for r in report.rows if r.calibration), default=0)
    cpu = any((r.device or "cpu") == "cpu" for r in report.rows)
    head = ["row", "seeds", "τ", "tokens verified / round", "TPS" + (" (CPU, indicative)" if cpu else ""),
            "Δτ % vs full", "Δ verified / round % vs full", "ΔTPS % vs full", "ECE"] + [f"ECE_{j}" for j in range(1, k + 1)] + [
            "held-out ECE, raw → STS", "STS temperatures"]
    lines = [f"**Verify schedules** — sweep `{report.sweep}`; DSpark and ReaDy under the full schedule (every draft "
             "verified) and the confidence schedule (the prefix the confidence head keeps). τ, tokens verified per "
             "round (drafts + the anchor) and TPS pooled over every suite's prompts and the seeds, 95 % intervals "
             "(crossed bootstrap over seeds and prompts); Δ: the confidence schedule against the full one, paired "
             "prompt by prompt and seed by seed. ECE: the confidence head's expected calibration error of its "
             "predicted prefix acceptance (20 bins; per draft position j, and over positions weighted by their "
             "rounds); under the confidence schedule only the positions a row verified are observed. STS: DSpark's "
             "sequential temperature scaling (one temperature per position, fitted left to right to minimise the ECE "
             "of the prefix acceptance) fitted on the even-numbered prompts and scored on the odd ones.", "",
             "| " + " | ".join(head) + " |", "|:--|" + "--:|" * (len(head) - 1)]
    for r in report.rows:
        cal = r.calibration or {}
        per = {p["position"]: p["ece"] for p in cal.get("positions", [])}
        cells = [r.label, ", ".join(map(str, r.seeds)), _fmt(r.tau), _fmt(r.verified), _fmt(r.tps, 1),
                 _fmt(r.vs_full.get("tau"), 1, True), _fmt(r.vs_full.get("verified"), 1, True),
                 _fmt(r.vs_full.get("tps"), 1, True),
                 f"{cal['ece']:.3f}" if cal.get("ece") is not None else "—"]
        cells += [f"{per[j]:.3f}" if per.get(j) is not None else "—" for j in range(1, k + 1)]
        sts = r.sts or {}
        cells += [f"{sts['holdout_ece_before']:.3f} → {sts['holdout_ece_after']:.3f}" if sts else "—",
                  ", ".join(f"{t:.2f}" for t in sts["temperatures"]) if sts else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    if report.settings:
        lines += ["", "Settings: " + ", ".join(f"{s} = `{g or '(untagged)'}`" for s, g in report.settings.items()) + "."]
    lines += [f"Note: {n}." for n in report.notes]
    return "\n".join(lines) + "\n"


def plot_reliability(report: Report, out_stem: Path) -> list[Path]:
    """One panel per draft position: observed against predicted prefix acceptance per bin, one line per row
    (marker area ~ the bin's rounds), the diagonal for a calibrated head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.rows if r.calibration]
    k = max(len(r.calibration["positions"]) for r in rows)
    cols = min(4, k)
    nrows = (k + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 3.0 * nrows), squeeze=False)
    styles = {"full": "-", "confidence": "--"}
    colors = {"dspark": "C0", "ready": "C1"}
    for j in range(k):
        ax = axes[j // cols][j % cols]
        ax.plot([0, 1], [0, 1], ":", color="0.6", linewidth=1)
        for r in rows:
            p = r.calibration["positions"][j]
            if not p["reliability"]:
                continue
            pred = [b[3] for b in p["reliability"]]
            obs = [b[4] for b in p["reliability"]]
            size = [max(4.0, 60.0 * b[2] / max(1, p["n"])) for b in p["reliability"]]
            ax.plot(pred, obs, styles.get(r.schedule, "-"), color=colors.get(r.method, "C2"), linewidth=1.2,
                    label=f"{r.label} (ECE {p['ece']:.3f})")
            ax.scatter(pred, obs, s=size, color=colors.get(r.method, "C2"), alpha=0.6)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"draft position {j + 1}", fontsize=9)
        ax.set_xlabel("predicted prefix acceptance", fontsize=8)
        ax.set_ylabel("observed", fontsize=8)
        ax.legend(fontsize=6, loc="upper left")
    for j in range(k, nrows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(f"Confidence-head reliability — sweep {report.sweep} (seeds and prompts pooled)", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_stem)


def build_calibration(tracking_uri: str, sweep: str, out_dir: str | Path,
                      echo=print) -> list[Path]:
    """Write the table and the figure of `sweep` under `out_dir`; returns the files written."""
    if sweep not in collect.list_sweeps(tracking_uri):
        raise ReportError(f"tracking URI {tracking_uri!r}: no experiment ready-{sweep}; run "
                          f"`python -m sweeps.run {sweep}` first")
    out = Path(out_dir)
    runs = collect.load_runs(tracking_uri, sweep)
    evaluations = collect.load_evaluations(tracking_uri, runs, out / ".cache" / "evaluations", echo=echo)
    report = build(runs, evaluations, sweep)
    if not report.rows:
        raise ReportError(f"sweep {sweep}: no finished DSpark or ReaDy run with its evaluation.json; nothing to report")
    text = render(report)
    md = out / f"{STEM.format(sweep=sweep)}.md"
    atomic_write_text(md, text)
    written = [md]
    if any(r.calibration for r in report.rows):
        written += plot_reliability(report, out / FIGURE_STEM.format(sweep=sweep))
    else:
        echo(f"{FIGURE_STEM.format(sweep=sweep)}: not drawn; no row has confidence-head scores (drafter.confidence_head)")
    echo(text)
    return written


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports.calibration", description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default=SWEEP, help=f"the sweep (default {SWEEP})")
    ap.add_argument("--tracking-uri", default=collect.default_tracking_uri(),
                    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    ap.add_argument("--out", default="reports/out", help="output folder (default: reports/out)")
    a = ap.parse_args(argv)
    try:
        paths = build_calibration(a.tracking_uri, a.sweep, a.out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
