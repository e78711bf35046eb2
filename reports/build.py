"""`python -m reports.build`: write the paper's tables (LaTeX + Markdown), Figure 5 and, for a sweep
evaluated at several `eval.concurrency` values, its TPS-vs-concurrency figure, from MLflow.

    python -m reports.build                         # every sweep in sqlite:///mlflow.db
    python -m reports.build --sweep rank --fragment # tabular-only reports/out/table3.tex

Beside the tables it writes `tables.tex`, one document that inputs every table and figure written,
and compiles it to `tables.pdf` with pdflatex when pdflatex is on PATH; it says which happened, or why
not (pdflatex missing, or its first error). The sweep runner calls `build_reports` when a sweep finishes.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

import polars as pl

from ready.artifacts import atomic_write_bytes, atomic_write_text
from ready.config import entry_point
from reports import collect, concurrency, latex, markdown
from reports.errors import ReportError
from reports.figures import plot_survival, survival_curves
from reports.tables import build_table, seeds_text

FIGURE_STEM = "fig5_survival"
CONCURRENCY_STEM = "fig_tps_concurrency_{sweep}"
MAIN_SWEEP = "main"
CACHE = Path(".cache") / "evaluations"  # under the output folder: evaluation.json per finished run id
DOCUMENT_STEM = "tables"  # the document that inputs every table and figure: tables.tex -> tables.pdf
PDFLATEX_TIMEOUT_S = 300


def _evaluations(tracking_uri: str, runs: pl.DataFrame, out_dir: Path, echo: Callable[[str], None]) -> dict[str, dict]:
    return collect.load_evaluations(tracking_uri, runs, out_dir / CACHE, echo=echo)


def _figure(tracking_uri: str, loaded: dict[str, pl.DataFrame], out_dir: Path,
            echo: Callable[[str], None]) -> list[Path]:
    """Figure 5 from the `main` sweep (of the store, even when not asked for) when it has DSpark
    and ReaDy survival metrics, else from the first of the reported sweeps that does."""
    if MAIN_SWEEP not in loaded and MAIN_SWEEP in collect.list_sweeps(tracking_uri):
        loaded = {MAIN_SWEEP: collect.latest_setting(collect.load_runs(tracking_uri, MAIN_SWEEP))[0], **loaded}
    order = sorted(loaded, key=lambda s: s != MAIN_SWEEP)
    for sweep in order:
        runs = loaded[sweep]
        if not survival_curves(runs):  # no DSpark + ReaDy survival metrics: no need for the logs
            continue
        curves = survival_curves(runs, _evaluations(tracking_uri, runs, out_dir, echo))
        if not curves:
            continue
        variants = collect.aggregate(runs)
        n = seeds_text(collect.seed_counts(variants))
        model = ", ".join(collect.models(runs)) or "unknown model"
        bands = ("95 % bands over seeds and prompts" if any(c.lo for p in curves.values() for c in p)
                 else "bands: ± std over seeds")
        paths = plot_survival(curves, f"Draft-prefix survival — sweep {sweep}, {model}, {n}; {bands}",
                              out_dir / FIGURE_STEM)
        gaps = sorted({b for b, pair in curves.items() for c in pair if None in c.mean})
        if gaps:
            echo(f"{FIGURE_STEM}: some draft positions have no survival metric on {', '.join(gaps)}; left as gaps")
        echo(f"{FIGURE_STEM}: sweep {sweep} -> {', '.join(str(p) for p in paths)}")
        return paths
    echo(f"{FIGURE_STEM}: not written; no sweep among {', '.join(order) or 'none'} has survival metrics "
         "(<benchmark>/survival_<j>) for both a DSpark and a ReaDy run")
    return []


def _concurrency_figures(tracking_uri: str, every_run: dict[str, pl.DataFrame], out_dir: Path,
                         echo: Callable[[str], None]) -> list[Path]:
    """Per sweep whose settings ran several `eval.concurrency` values: decode TPS against concurrency
    (`reports.concurrency`, over all its settings, not only the one the tables report)."""
    written: list[Path] = []
    for sweep, runs in every_run.items():
        data = concurrency.tps_by_concurrency(runs)
        if data is None:
            continue
        used = runs.filter(pl.col("run_id").is_in(data.run_ids))
        logs = {} if concurrency.devices_in_params(used) else _evaluations(tracking_uri, used, out_dir, echo)
        found = concurrency.devices(used, logs)
        stem = CONCURRENCY_STEM.format(sweep=sweep)
        variants = collect.aggregate(used)
        model = ", ".join(collect.models(used)) or "unknown model"
        note = concurrency.timing_note(found)
        title = (f"Decode TPS vs concurrency — sweep {sweep}, {model}, {seeds_text(collect.seed_counts(variants))}; "
                 f"mean ± std over seeds" + (f"\n{note}" if note else ""))
        paths = concurrency.plot_tps(data, title, out_dir / stem)
        for msg in data.notes:
            echo(f"{stem}: {msg}")
        cs = ", ".join(map(str, data.concurrencies))
        echo(f"{stem}: sweep {sweep}, concurrency {cs}{'; ' + note if note else ''} -> {', '.join(str(p) for p in paths)}")
        written += paths
    return written


def build_reports(
    tracking_uri: str,
    sweeps: Sequence[str] | None,
    out_dir: str | Path,
    fragment: bool = False,
    *,
    echo: Callable[[str], None] | None = print,
) -> list[Path]:
    """Write `<table>.tex` + `<table>.md` per sweep, the survival figure and, per sweep that ran several
    `eval.concurrency` values, `fig_tps_concurrency_<sweep>.pdf/.png`; return the files written.

    `sweeps` None or empty means every `ready-*` experiment in the store. `fragment` writes
    tabular-only .tex files for \\input{}. Each Markdown table is also passed to `echo` (print).
    Every finished run's evaluation.json is read (once; cached under `<out_dir>/.cache/evaluations`)
    for the paired intervals. Raises ReportError for a store or sweep that does not exist.
    """
    say = echo or (lambda _msg: None)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: is a file; expected a folder for the reports")
    above = next((p for p in out.parents if p.exists()), None)  # the folder it would be made in
    if above is not None and not above.is_dir():
        raise ReportError(f"--out {out}: {above} is a file, so no folder can be made under it; expected a folder for "
                          "the reports")
    names = list(dict.fromkeys(sweeps or [])) or collect.list_sweeps(tracking_uri)
    if not names:
        raise ReportError(f"tracking URI {tracking_uri!r}: no experiments named ready-<sweep>; run a sweep first")
    loaded, every_run = {}, {}
    for name in names:
        every_run[name] = collect.load_runs(tracking_uri, name)  # every setting: the concurrency figure's
        runs, msg = collect.latest_setting(every_run[name])
        if msg:
            say(f"sweep {name}: {msg}")
        loaded[name] = runs
    written: list[Path] = []
    for sweep, runs in loaded.items():
        if runs.height == 0:
            say(f"sweep {sweep}: no variant runs yet; no table written")
            continue
        table = build_table(sweep, runs, _evaluations(tracking_uri, runs, out, say))  # one sweep's logs at a time
        tex = out / f"{table.spec.name}.tex"
        md = out / f"{table.spec.name}.md"
        text = markdown.render(table)
        atomic_write_text(tex, latex.render(table, fragment=fragment))
        atomic_write_text(md, text)
        written += [tex, md]
        say(text)
    written += _figure(tracking_uri, loaded, out, say)
    written += _concurrency_figures(tracking_uri, every_run, out, say)
    written += _document(out, written, fragment, say)
    return written


def _document(out: Path, written: list[Path], fragment: bool, say: Callable[[str], None]) -> list[Path]:
    """`tables.tex` (every table and figure of `written`) and, when pdflatex is there, `tables.pdf`;
    says which was made, or why the PDF was not."""
    tables = [p for p in written if p.suffix == ".tex"]
    figures = [p for p in written if p.suffix == ".pdf"]
    if fragment:
        say(f"{DOCUMENT_STEM}.pdf: not compiled: --fragment writes tabulars for \\input{{}} in your own document")
        return []
    if not tables and not figures:
        return []
    body = [rf"\input{{{p.stem}}}" for p in tables]
    body += [rf"\begin{{figure}}[h]\centering\includegraphics[width=\linewidth]{{{p.name}}}\end{{figure}}" for p in figures]
    tex = out / f"{DOCUMENT_STEM}.tex"
    atomic_write_text(tex, "% generated by `python -m reports.build`: every table and figure of this folder\n"
                           "\\documentclass{article}\n\\usepackage[margin=1.5cm]{geometry}\n\\usepackage{booktabs}\n"
                           "\\usepackage{graphicx}\n\\begin{document}\n" + "\n\\clearpage\n".join(body)
                           + "\n\\end{document}\n")
    pdf, why = compile_pdf(tex)
    if pdf is None:
        say(f"{DOCUMENT_STEM}.pdf: not compiled: {why}; the .tex files are written ({tex})")
        return [tex]
    say(f"{DOCUMENT_STEM}.pdf: compiled by pdflatex from {tex.name} ({len(tables)} tables, {len(figures)} figures) "
        f"-> {pdf}")
    return [tex, pdf]


def compile_pdf(tex: Path) -> tuple[Optional[Path], str]:
    """(the PDF pdflatex made of `tex`, beside it; None and why not). pdflatex runs in `tex`'s folder
    (its \\input files are there) and writes its aux and log files in a temporary folder."""
    exe = shutil.which("pdflatex")
    if exe is None:
        return None, ("pdflatex is not on PATH (Debian/Ubuntu: apt-get install texlive-latex-base "
                      "texlive-latex-recommended)")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([exe, "-interaction=nonstopmode", "-halt-on-error", f"-output-directory={tmp}",
                                   tex.name], cwd=tex.parent, capture_output=True, text=True,
                                  timeout=PDFLATEX_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"pdflatex did not finish within {PDFLATEX_TIMEOUT_S} s"
        made = Path(tmp) / f"{tex.stem}.pdf"
        if proc.returncode != 0 or not made.is_file():
            log = Path(tmp) / f"{tex.stem}.log"
            text = log.read_text(errors="replace") if log.is_file() else proc.stdout
            first = next((ln for ln in text.splitlines() if ln.startswith("!")), f"exit status {proc.returncode}")
            return None, f"pdflatex failed: {first.strip()}"
        pdf = tex.with_suffix(".pdf")
        atomic_write_bytes(pdf, made.read_bytes())
    return pdf, ""


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.build", description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="append", default=[], metavar="NAME",
                        help="sweep to report (repeatable; default: every ready-<sweep> experiment)")
    parser.add_argument("--tracking-uri", default=collect.default_tracking_uri(),
                        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--out", default="reports/out", help="output folder (default: reports/out)")
    parser.add_argument("--fragment", action="store_true", help="write tabular-only .tex fragments for \\input{}")
    args = parser.parse_args(argv)
    try:
        paths = build_reports(args.tracking_uri, args.sweep, args.out, fragment=args.fragment)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(paths)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
