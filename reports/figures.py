"""Figure 5: cumulative draft-prefix survival P_j by draft position, DSpark vs ReaDy, per benchmark.

With the runs' evaluation.json, each curve is P_j pooled over seeds and prompts with a 95 % band
(`reports.stats.survival`: the closed-form crossed interval; P_j censored at each round's horizon, the
counts τ = 1 + Σ_j P_j is read from, `ready.metrics`). Without them, the curve is the mean
over seeds of the logged `<benchmark>/survival_<j>` metrics (already cumulative and censored
there) with a ± std band. Not-lossless runs are left out either way.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import polars as pl

from ready.artifacts import atomic_write_bytes
from reports import collect
from reports import stats
from reports.collect import METHOD_NAMES, Variant
from reports.intervals import Evidence
from reports.tables import BENCHMARK_NAMES, SUMMARY

_SURVIVAL = re.compile(r"^(?P<bench>[^/]+)/survival_(?P<j>\d+)$")
METHODS = ("dspark", "ready")
MAX_COLUMNS = 4  # panels per row


@dataclass(frozen=True)
class Curve:
    """P_j for j = 1..K of one variant on one benchmark (None where that position is missing)."""

    label: str
    positions: tuple[int, ...]
    mean: tuple[float | None, ...]
    std: tuple[float | None, ...]
    lo: tuple[float | None, ...] = ()  # 95 % band from the per-prompt logs (empty without them)
    hi: tuple[float | None, ...] = ()


def survival_positions(runs: pl.DataFrame) -> dict[str, list[int]]:
    """Benchmark -> sorted draft positions that some run logged a survival metric for."""
    out: dict[str, set[int]] = {}
    for col in collect.metric_columns(runs):
        m = _SURVIVAL.match(col)
        if m:
            out.setdefault(m["bench"], set()).add(int(m["j"]))
    return {b: sorted(js) for b, js in out.items()}


def _pick(variants: Sequence[Variant], method: str, positions: dict[str, list[int]]) -> Variant | None:
    """The first variant (in `ready.order`) of a method that logged survival metrics."""
    for v in variants:
        if v.method == method and any(v.stat(f"{b}/survival_{js[0]}")[0] for b, js in positions.items()):
            return v
    return None


def _banded(ev: Evidence, v: Variant, bench: str, positions: Sequence[int], label: str) -> Curve | None:
    """The curve pooled over seeds and prompts with its 95 % band, when v has per-prompt logs."""
    band = ev.survival(v, bench)
    if not band:
        return None
    pick = [band[j - 1] if j <= len(band) else None for j in positions]
    return Curve(label, tuple(positions), tuple(iv.value if iv else None for iv in pick),
                 tuple(None for _ in pick), tuple(iv.lo if iv else None for iv in pick),
                 tuple(iv.hi if iv else None for iv in pick))


def survival_curves(runs: pl.DataFrame, evaluations: Mapping[str, dict] | None = None) -> dict[str, list[Curve]]:
    """Benchmark -> [DSpark curve, ReaDy curve]; empty when either is absent.

    Benchmarks are those with survival metrics other than `overall`, or `overall` alone when
    nothing else has them. The ReaDy curve is the first `ready` variant in `ready.order`. With
    `evaluations` (run id -> evaluation.json) a curve gets a 95 % band, else mean ± std over seeds.
    """
    runs, _aside = collect.set_aside_not_lossless(runs)
    ev = Evidence(runs, evaluations or {})
    positions = survival_positions(runs)
    if set(positions) - {SUMMARY}:
        positions.pop(SUMMARY, None)
    variants = collect.aggregate(runs)
    chosen = [_pick(variants, m, positions) for m in METHODS]
    if not positions or any(v is None for v in chosen):
        return {}
    bench_order = collect.benchmarks(runs, "survival_1") or list(positions)
    out: dict[str, list[Curve]] = {}
    for b in [x for x in bench_order if x in positions] + [x for x in positions if x not in bench_order]:
        curves = []
        for v in chosen:
            assert v is not None
            name = METHOD_NAMES[v.method]
            label = name if v.name == name else f"{name} ({v.name})"
            banded = _banded(ev, v, stats.OVERALL if b == SUMMARY else b, positions[b], label)
            if banded is not None:
                curves.append(banded)
                continue
            logged = [v.stat(f"{b}/survival_{j}")[0] for j in positions[b]]
            curves.append(Curve(label, tuple(positions[b]), tuple(s.mean if s else None for s in logged),
                                tuple(s.std if s and s.n > 1 else None for s in logged)))
        out[b] = curves
    return out


def save_figure(fig, out_stem: Path) -> list[Path]:
    """`fig` as <out_stem>.pdf (no creation date: reproducible bytes) and .png, each written
    atomically; the figure is closed. Returns the paths."""
    import matplotlib.pyplot as plt

    written = []
    for ext, kw in (("pdf", {"metadata": {"CreationDate": None}}), ("png", {"dpi": 200})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        path = out_stem.with_suffix(f".{ext}")
        atomic_write_bytes(path, buf.getvalue())
        written.append(path)
    plt.close(fig)
    return written


def plot_survival(curves: dict[str, list[Curve]], title: str, out_stem: Path) -> list[Path]:
    """Draw one panel per benchmark; write `<stem>.pdf` and `<stem>.png` atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(curves)
    ncols = min(n, MAX_COLUMNS)
    nrows = -(-n // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 0.4, 2.8 * nrows + 0.3), squeeze=False, sharey=True)
    axes = [ax for row in grid for ax in row]
    for ax in axes[n:]:
        ax.set_visible(False)
    styles = [dict(color="0.45", linestyle="--", marker="s"), dict(color="tab:red", linestyle="-", marker="o")]
    for ax, (bench, pair) in zip(axes, curves.items()):
        for curve, style in zip(pair, styles):
            xs = [x for x, y in zip(curve.positions, curve.mean) if y is not None]
            ys = [y for y in curve.mean if y is not None]
            ax.plot(xs, ys, label=curve.label, markersize=4, **style)
            if curve.lo:  # 95 % band from the per-prompt logs
                band = [(x, lo, hi) for x, lo, hi in zip(curve.positions, curve.lo, curve.hi) if lo is not None and hi is not None]
            else:  # ± std over seeds
                band = [(x, y - s, y + s) for x, y, s in zip(curve.positions, curve.mean, curve.std)
                        if y is not None and s is not None]
            if band:
                bx, blo, bhi = zip(*band)
                ax.fill_between(bx, blo, bhi, color=style["color"], alpha=0.2, linewidth=0)
        ax.set_title(BENCHMARK_NAMES.get(bench, bench))
        ax.set_xlabel("Draft position $j$")
        ax.set_xticks(pair[0].positions)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for row in grid:
        row[0].set_ylabel("Prefix survival $P_j$")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_stem)
