"""`python -m sweeps.phases NAME`: where a sweep's time and GPU memory went, row by row, from its MLflow store.

    python -m sweeps.phases ft_control --tracking-uri sqlite:////tmp/gpu-run/mlflow.db

One line per row of the sweep's newest setting (and one for the shared builds, from its newest parent run):
each phase's seconds (`phase/<name>_s`, `ready.phases`), and on CUDA its peak allocated GPU memory in GB
(`phase/<name>_peak_gb`), the row's total (`time/run_s`) and whether the worker's kept target served it. Needs
MLflow only (no polars): it runs where the sweep ran, or on the store brought back.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ready.config import entry_point
from sweeps import tracking
from sweeps.table import render

PREFIXES = ("phase/", "prepare/")


def phase_rows(uri: str, sweep: str) -> tuple[list[str], list[list]]:
    """(headers, rows) of the phase table of `sweep`'s newest setting in the store at `uri`."""
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(tracking.experiment_name(sweep))
    if exp is None:
        raise ValueError(f"sweep {sweep!r}: no experiment {tracking.experiment_name(sweep)} in {uri}; expected a "
                         "store a `python -m sweeps.run` of it wrote")
    runs = c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=5000)
    children = [r for r in runs if r.data.tags.get("ready.kind") == "variant"]
    if not children:
        raise ValueError(f"sweep {sweep!r}: no row runs in {uri}")
    setting = children[0].data.tags.get("ready.setting")
    children = sorted((r for r in children if r.data.tags.get("ready.setting") == setting),
                      key=lambda r: (int(r.data.tags.get("ready.order", "0")), r.data.tags.get("ready.seed", "")))
    parent = next((r for r in runs if r.data.tags.get("ready.kind") == "sweep"
                   and any(k.startswith("prepare/") for k in r.data.metrics)), None)
    named = [(f"{r.data.tags.get('ready.label')} s{r.data.tags.get('ready.seed')}", r, "phase/") for r in children]
    if parent is not None:
        named.insert(0, ("(shared builds)", parent, "prepare/"))
    phases: list[str] = []
    for _, r, prefix in named:
        for k in r.data.metrics:
            if k.startswith(prefix) and k.endswith("_s"):
                name = k[len(prefix):-2]
                if name not in phases:
                    phases.append(name)
    headers = ["row", *[f"{p} s (GB)" for p in phases], "total s", "target kept"]
    rows = []
    for label, r, prefix in named:
        m = r.data.metrics
        cells = []
        for p in phases:
            s, gb = m.get(f"{prefix}{p}_s"), m.get(f"{prefix}{p}_peak_gb")
            cells.append("-" if s is None else f"{s:.1f}" + (f" ({gb:.1f})" if gb is not None else ""))
        total = m.get("time/run_s")
        rows.append([label, *cells, "-" if total is None else f"{total:.1f}",
                     r.data.tags.get("ready.target_reused", "-")])
    return headers, rows


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.phases", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("sweep", help="the sweep's name (experiment ready-<name>)")
    ap.add_argument("--tracking-uri", default=None, help="MLflow store (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    a = ap.parse_args(argv)
    try:
        headers, rows = phase_rows(tracking.resolve_tracking_uri(a.tracking_uri), a.sweep)
    except ValueError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(render(headers, rows, title=f"phases of sweep {a.sweep}: seconds (peak GPU GB) per row"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
