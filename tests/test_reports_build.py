"""reports.build end to end: synthetic runs logged into a temporary MLflow store under the
docs/interfaces.md naming contract, tables checked cell by cell against hand-computed values,
every .tex compiled by pdflatex and read back, and the survival figure written."""

import shutil
import subprocess
from pathlib import Path

import pytest

from reports import latex
from reports.build import build_reports, main
from reports.collect import load_runs
from reports.errors import ReportError
from reports.figures import survival_curves
from reports.tables import build_table

BENCHES = ("humaneval", "heldout")
MODEL = "tiny-test"


def _log(client, exp_id, parent_id, sweep, table, *, method, label, order, seed, metrics, status="FINISHED"):
    from mlflow.entities import Metric, Param

    variant = f"{sweep}-{label}"
    tags = {
        "ready.kind": "variant",
        "mlflow.parentRunId": parent_id,
        "ready.sweep": sweep,
        "ready.table": table,
        "ready.method": method,
        "ready.label": label,
        "ready.order": str(order),
        "ready.variant_id": variant,
        "ready.config_hash": f"{variant}-{seed}",
        "ready.model": MODEL,
        "ready.seed": str(seed),
        "ready.git_commit": "0" * 40,
        "ready.resolved_layers": "[1, 3]",
    }
    run = client.create_run(exp_id, tags=tags, run_name=f"{label}-s{seed}")
    params = {"seed": str(seed), "reader.rank": "8", "reader.layers": "[30, 62]", "bench.suites": str(list(BENCHES))}
    # the runner's own gains and speedups are logged deliberately wrong: reports must recompute them
    for key in [k for k in metrics if k.endswith("/tps")]:
        b = key.split("/")[0]
        metrics = {**metrics, f"{b}/tps_gain_pct": 999.0, f"{b}/tau_gain_pct": 999.0, f"{b}/speedup": 99.0}
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()],
        params=[Param(k, v) for k, v in params.items()],
    )
    client.set_terminated(run.info.run_id, status=status)


def _sweep(client, sweep, table, variants):
    exp_id = client.create_experiment(f"ready-{sweep}")
    parent = client.create_run(exp_id, tags={"ready.kind": "sweep", "ready.sweep": sweep})
    for method, label, order, per_seed in variants:
        for seed, metrics in enumerate(per_seed):
            status = metrics.pop("status", "FINISHED") if metrics else "FINISHED"
            _log(client, exp_id, parent.info.run_id, sweep, table, method=method, label=label, order=order,
                 seed=seed, metrics=metrics, status=status)
    client.set_terminated(parent.info.run_id)


def _overall(tau=None, tps=None, **extra):
    out = dict(extra)
    if tau is not None:
        out["overall/tau"] = tau
    if tps is not None:
        out["overall/tps"] = tps
    return out


def _bench(tps_he, tau_he, tps_ho, tau_ho, surv=None):
    m = {"humaneval/tps": tps_he, "humaneval/tau": tau_he, "heldout/tps": tps_ho, "heldout/tau": tau_ho,
         "overall/tps": (tps_he + tps_ho) / 2, "overall/tau": (tau_he + tau_ho) / 2, "humaneval/lossless": 1.0}
    for b in BENCHES if surv else ():
        m.update({f"{b}/survival_{j + 1}": p for j, p in enumerate(surv)})
    return m


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    # Table 3: 2 seeds; logged out of order, with an order ("10") that sorts wrong as a string
    _sweep(client, "rank", "table3", [
        ("ready", "r=128", 10, [_overall(4.6, 100.0), _overall(4.7, 104.0)]),
        ("ready", "r=8", 1, [_overall(4.4, 120.0), _overall(4.6, 118.0)]),
        ("dspark", "DSpark", 0, [_overall(4.0, 100.0), _overall(4.2, 110.0)]),
        ("ready", "r=16", 2, [_overall(4.5, 112.0), _overall(4.7, 114.0)]),
        ("ar", "AR", -1, [_overall(1.0, 40.0), _overall(1.0, 40.0)]),
    ])
    # Table 4: one run without TPS, one variant whose only run failed
    _sweep(client, "layers", "table4", [
        ("dspark", "DSpark", 0, [_overall(4.0, 100.0)]),
        ("ready", "{62}", 1, [_overall(4.3)]),
        ("ready", "{30,62}", 2, [_overall(4.5, 120.0, status="FAILED")]),
        ("ready", "{2,30,62}", 3, [_overall(4.2, 103.0)]),
    ])
    # Table 6: no DSpark baseline at all
    _sweep(client, "inject_pos", "table6", [
        ("ready", "post", 0, [_overall(4.5, 110.0)]),
        ("ready", "pre", 1, [_overall(4.4, 108.0)]),
    ])
    # Table 1 + Figure 5: 2 seeds, two benchmarks, survival over K = 3 positions
    _sweep(client, "main", "table1", [
        ("ar", "AR", 0, [_bench(50, 1, 40, 1), _bench(50, 1, 44, 1)]),
        ("dspark", "DSpark", 1, [_bench(150, 4.0, 100, 3.0, [0.8, 0.6, 0.4]), _bench(160, 4.2, 110, 3.2, [0.8, 0.5, 0.3])]),
        ("ready", "ReaDy", 2, [_bench(165, 4.4, 108, 3.3, [0.9, 0.7, 0.5]), _bench(171, 4.6, 116, 3.5, [0.9, 0.7, 0.5])]),
    ])
    # a Table-1 sweep the paper does not name, with no AR run and a ReaDy run missing a benchmark
    ready = _bench(66, 5.5, 50, 5.0)
    for key in ("heldout/tps", "heldout/tau"):
        del ready[key]
    _sweep(client, "main_gaps", "table1", [
        ("dspark", "DSpark", 1, [_bench(60, 5.0, 50, 4.0)]),
        ("ready", "ReaDy", 2, [ready]),
    ])
    return uri


@pytest.fixture(scope="module")
def built(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    paths = build_reports(store, None, out, echo=None)
    return out, paths


def _rows(md: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell."""
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_ablation_rows_follow_ready_order_with_dspark_reference_first(store):
    table = build_table("rank", load_runs(store, "rank"))
    assert [r[0].text for r in table.rows] == ["DSpark", "r=8", "r=16", "r=128"]  # no AR row
    assert table.spec.name == "table3" and table.seeds == (2, 2) and table.models == [MODEL]


def test_ablation_cells_mean_std_gains_and_bold_match_hand_computation(built):
    out, _ = built
    rows = _rows((out / "table3.md").read_text())
    # DSpark tau (4.0, 4.2): mean 4.1, sample std 0.1414; TPS (100, 110): 105 ± 7.07
    assert rows["DSpark"] == ["4.1000 ± 0.1414", "105.00 ± 7.07", "ref.", "ref."]
    # r=8: tau 4.5 ± 0.1414 (+9.76 % = 4.5/4.1 - 1); TPS 119 ± 1.41 (+13.33 % = 119/105 - 1), best TPS
    assert rows["r=8"] == ["4.5000 ± 0.1414", "**119.00 ± 1.41**", "+9.76", "**+13.33**"]
    # r=16: tau 4.6 (+12.20); TPS 113 ± 1.41 (+7.62)
    assert rows["r=16"] == ["4.6000 ± 0.1414", "113.00 ± 1.41", "+12.20", "+7.62"]
    # r=128: tau 4.65 ± 0.0707, best (+13.41); TPS 102 ± 2.83, slower than DSpark (-2.86)
    assert rows["r=128"] == ["**4.6500 ± 0.0707**", "102.00 ± 2.83", "**+13.41**", "-2.86"]
    assert "999" not in (out / "table3.tex").read_text()  # logged gains are not trusted


def test_latex_table_uses_booktabs_bold_caption_and_label(built):
    out, _ = built
    tex = (out / "table3.tex").read_text()
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){4-5}"):
        assert rule in tex
    assert r"\begin{tabular}{lrrrr}" in tex and "|" not in tex.split(r"\begin{tabular}")[1]
    assert r"$\mathbf{119.00 \pm 1.41}$" in tex and r"$4.5000 \pm 0.1414$" in tex
    assert r"\label{tab:ready-rank}" in tex
    wide = (out / "table1.tex").read_text()  # 12 columns: a two-column float scaled to the text width
    assert r"\begin{table*}" in wide and r"\resizebox{\textwidth}{!}{%" in wide
    caption = tex.split(r"\caption{")[1].split("\n")[0]
    assert r"\texttt{rank}" in caption and rf"\texttt{{{latex.escape(MODEL)}}}" in caption and "2 seeds" in caption


def test_main_table_per_benchmark_and_average(built):
    out, _ = built
    rows = _rows((out / "table1.md").read_text())
    assert list(rows)[1:] == ["HumanEval", "Held-out", "Average"]  # bench.suites order, then the average
    # columns: AR TPS × τ | DSpark TPS × τ | ReaDy TPS × τ | gain TPS τ
    # HumanEval: AR 50; DSpark 155 ± 7.07, 155/50 = 3.10×, τ 4.10; ReaDy 168 ± 4.24, 3.36×, τ 4.50
    # gains 168/155 - 1 = +8.39 %, 4.5/4.1 - 1 = +9.76 %
    assert rows["HumanEval"] == [
        "50.00 ± 0.00", "1.00×", "1.00 ± 0.00",
        "155.00 ± 7.07", "3.10×", "4.10 ± 0.14",
        "**168.00 ± 4.24**", "**3.36×**", "**4.50 ± 0.14**",
        "+8.39", "+9.76",
    ]
    # Average per run then over seeds: AR (45, 47), DSpark (125, 135), ReaDy (136.5, 143.5);
    # 130/46 = 2.83×, 140/46 = 3.04×, 140/130 - 1 = +7.69 %; τ DSpark 3.60, ReaDy 3.95: +9.72 %
    assert rows["Average"] == [
        "46.00 ± 1.41", "1.00×", "1.00 ± 0.00",
        "130.00 ± 7.07", "2.83×", "3.60 ± 0.14",
        "**140.00 ± 4.95**", "**3.04×**", "**3.95 ± 0.14**",
        "+7.69", "+9.72",
    ]
    assert "Missing" not in (out / "table1.md").read_text()


def test_missing_run_and_metric_render_dashes_and_footnotes(built):
    out, _ = built
    md = (out / "table4.md").read_text()
    rows = _rows(md)
    assert rows["{62}"] == ["**4.3000**", "—†", "**+7.50**", "—†"]  # 4.3/4.0 - 1; TPS never logged
    assert rows["{30,62}"] == ["—†"] * 4  # its only run failed
    # 103 > DSpark's 100 is the best TPS; its +3.00 % is the only TPS gain, so nothing to bold
    assert rows["{2,30,62}"] == ["4.2000", "**103.00**", "+5.00", "+3.00"]
    assert "† Missing: {62}: metric overall/tps not logged in any run." in md
    assert "† Missing: {30,62}: no finished run (status FAILED)." in md
    tex = (out / "table4.tex").read_text()
    assert r"--$^{\dagger}$" in tex and r"\{30,62\}: no finished run (status FAILED)" in tex


def test_main_table_with_missing_baseline_and_benchmark(built):
    out, _ = built
    md = (out / "table1_main_gaps.md").read_text()
    rows = _rows(md)
    # no AR run: AR cells and every speedup are dashes; DSpark vs ReaDy still compare (66/60 - 1 = +10.00)
    assert rows["HumanEval"] == ["—†"] * 3 + ["60.00", "—†", "5.00"] + ["**66.00**", "—†", "**5.50**"] + ["+10.00", "+10.00"]
    assert rows["Held-out"] == ["—†"] * 3 + ["50.00", "—†", "4.00"] + ["—†"] * 3 + ["—†", "—†"]
    assert rows["Average"] == ["—†"] * 3 + ["55.00", "—†", "4.50"] + ["—†"] * 3 + ["—†", "—†"]
    for note in ("no AR run in sweep main_gaps: speedups not computed", "ReaDy: metric heldout/tps not logged in any run",
                 "ReaDy: Average needs every benchmark"):
        assert note in md


def test_sweep_without_dspark_keeps_a_dash_reference_row(built):
    out, _ = built
    md = (out / "table6.md").read_text()
    assert _rows(md)["DSpark"] == ["—†"] * 4
    assert _rows(md)["post"] == ["**4.5000**", "**110.00**", "—†", "—†"]
    assert "no DSpark run in sweep inject_pos: gains not computed" in md


def test_survival_curves_average_seeds_per_position(store):
    curves = survival_curves(load_runs(store, "main"))
    assert list(curves) == ["humaneval", "heldout"]
    ds, rd = curves["humaneval"]
    assert (ds.label, rd.label) == ("DSpark", "ReaDy")
    assert ds.positions == (1, 2, 3)
    assert ds.mean == pytest.approx((0.8, 0.55, 0.35))
    assert rd.mean == pytest.approx((0.9, 0.7, 0.5))


def test_figure_and_every_table_file_are_written(built):
    out, paths = built
    names = sorted(p.name for p in paths)
    for stem in ("table1", "table3", "table4", "table6", "table1_main_gaps"):
        assert f"{stem}.tex" in names and f"{stem}.md" in names
    pdf, png = out / "fig5_survival.pdf", out / "fig5_survival.png"
    assert pdf.read_bytes()[:5] == b"%PDF-" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*tmp*"))  # atomic writes leave no temp files


def _compile(tmp: Path, body: str) -> str:
    doc = tmp / "doc.tex"
    doc.write_text("\\documentclass{article}\n\\usepackage[margin=1cm]{geometry}\n\\usepackage{booktabs}\n\\usepackage{graphicx}\n"
                   f"\\begin{{document}}\n{body}\n\\end{{document}}\n")
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    log = (tmp / "doc.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    assert "! " not in log and "Output written on doc.pdf (1 page" in log
    assert "Overfull \\hbox" not in log  # every table fits the page (Table 1 is scaled to it)
    txt = subprocess.run(["pdftotext", "-layout", "doc.pdf", "-"], cwd=tmp, capture_output=True, text=True)
    return txt.stdout


needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdftotext") is None,
                               reason="needs pdflatex + pdftotext (.ci/run installs texlive-latex-recommended, poppler-utils)")


@needs_tex
def test_every_table_compiles_with_pdflatex_and_reads_back(built, tmp_path):
    out, _ = built
    for stem in ("table1", "table3", "table4", "table6", "table1_main_gaps"):
        shutil.copy(out / f"{stem}.tex", tmp_path / f"{stem}.tex")
        text = _compile(tmp_path, f"\\input{{{stem}}}")
        assert "Table 1: " in text  # the caption
        if stem == "table3":
            assert "119.00 ± 1.41" in text and "+13.41" in text and "Sweep rank" in text
        if stem == "table4":
            assert "Missing: {62}: metric overall/tps not logged in any run." in text
            assert "{30,62}: no finished run (status FAILED)." in text


@needs_tex
def test_cli_fragment_prints_markdown_and_compiles_inside_a_table(store, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--tracking-uri", store, "--sweep", "rank", "--out", str(out), "--fragment"]) == 0
    printed = capsys.readouterr().out
    assert "| r=8 | 4.5000 ± 0.1414 | **119.00 ± 1.41** |" in printed
    tex = (out / "table3.tex").read_text()
    assert tex.lstrip("%").count(r"\begin{table}") == 0 and r"\caption" not in tex.replace("% caption", "")
    # the rank sweep has no survival metrics, Figure 5 comes from the store's main sweep
    assert sorted(p.name for p in out.iterdir()) == ["fig5_survival.pdf", "fig5_survival.png", "table3.md", "table3.tex"]
    assert "fig5_survival: sweep main ->" in printed
    text = _compile(out, "\\begin{table}\\centering\\caption{By hand}\\input{table3}\\end{table}")
    assert "By hand" in text and "4.6500 ± 0.0707" in text


def test_no_survival_anywhere_skips_the_figure_with_a_message(store, tmp_path, monkeypatch):
    import reports.build

    assert survival_curves(load_runs(store, "rank")) == {}  # DSpark and ReaDy rows, no survival metrics
    monkeypatch.setattr(reports.build, "MAIN_SWEEP", "no-such-sweep")  # do not fall back to `main`
    messages = []
    paths = build_reports(store, ["rank", "layers"], tmp_path, echo=messages.append)
    assert sorted(p.name for p in paths) == ["table3.md", "table3.tex", "table4.md", "table4.tex"]
    assert messages[-1].startswith("fig5_survival: not written; no sweep among rank, layers has survival metrics")


def test_unknown_sweep_and_missing_store_are_one_clear_error(store, tmp_path, capsys):
    with pytest.raises(ReportError, match=r"sweep 'nope': no MLflow experiment 'ready-nope'.*sweeps found: inject_pos, layers, main, main_gaps, rank"):
        build_reports(store, ["nope"], tmp_path, echo=None)
    assert main(["--tracking-uri", f"sqlite:///{tmp_path}/absent.db", "--out", str(tmp_path)]) == 2
    assert "no MLflow database at" in capsys.readouterr().err
