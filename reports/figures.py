"""Figure 5: cumulative draft-prefix survival P_j by draft position, DSpark vs ReaDy, per benchmark.

Values are the `<benchmark>/survival_<j>` metrics the evaluation logged (already cumulative and
censored there); this module only averages them over seeds and draws them.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import polars as pl

from ready.artifacts import atomic_write_bytes
from reports import collect
from reports.collect import METHOD_NAMES, Variant
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


def survival_curves(runs: pl.DataFrame) -> dict[str, list[Curve]]:
    """Benchmark -> [DSpark curve, ReaDy curve] (mean ± std over seeds); empty when either is absent.

    Benchmarks are those with survival metrics other than `overall`, or `overall` alone when
    nothing else has them. The ReaDy curve is the first `ready` variant in `ready.order`.
    """
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
            stats = [v.stat(f"{b}/survival_{j}")[0] for j in positions[b]]
            name = METHOD_NAMES[v.method]
            label = name if v.name == name else f"{name} ({v.name})"
            curves.append(Curve(label, tuple(positions[b]), tuple(s.mean if s else None for s in stats),
                                tuple(s.std if s and s.n > 1 else None for s in stats)))
        out[b] = curves
    return out


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
            band = [(x, y, s) for x, y, s in zip(curve.positions, curve.mean, curve.std) if y is not None and s is not None]
            if band:
                bx, by, bs = zip(*band)
                ax.fill_between(bx, [y - s for y, s in zip(by, bs)], [y + s for y, s in zip(by, bs)],
                                color=style["color"], alpha=0.2, linewidth=0)
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
    written = []
    for ext, kw in (("pdf", {"metadata": {"CreationDate": None}}), ("png", {"dpi": 200})):
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, **kw)
        path = out_stem.with_suffix(f".{ext}")
        atomic_write_bytes(path, buf.getvalue())
        written.append(path)
    plt.close(fig)
    return written
