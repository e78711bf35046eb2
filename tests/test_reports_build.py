"""reports.build end to end: synthetic runs logged into a temporary MLflow store under the
docs/interfaces.md naming contract, tables checked cell by cell against hand-computed values,
every .tex compiled by pdflatex and read back, and the survival figure written.

Two sweeps (`rank`, `main_logs`) carry evaluation.json artifacts built from hand-made per-prompt
logs (tests/evaluation_logs.py), so their tables show paired intervals; the others have metrics
only, as runs logged before per-prompt logs existed, and show plain ratios."""

import functools
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from evaluation_logs import bench_rounds, evaluation, metrics_of
from reports import stats
from reports import latex, markdown
from reports.build import build_reports, main
from reports.collect import load_evaluations, load_runs
from reports.errors import ReportError
from reports.figures import survival_curves
from reports.mlflow_store import ensure_experiment
from reports.tables import build_table

BENCHES = ("humaneval", "heldout")
MODEL = "tiny-test"
PROMPTS, ROUNDS = 8, 30  # per benchmark and seed

# Table 3 from per-prompt logs: (method, label, order, τ gain vs DSpark (or per seed), wall_s per prompt,
# seeds that were not lossless, τ gain of the state-swapped decode); logged out of order, with an
# order ("10") that sorts wrong as a string
RANK_ROWS = [
    ("ready", "r=128", 10, 0.25, 0.05, (), -0.20),
    ("ready", "r=8", 3, 0.10, 0.09, (), -0.10),
    ("dspark", "DSpark", 0, 0.0, 0.10, (), None),
    ("ready", "r=16", 4, 0.01, 0.09, (), -0.01),
    ("ready", "r=32", 5, (0.05, 0.50), 0.09, (1,), -0.05),  # seed 1 (+50 %) differed from AR greedy
    ("placebo", "Placebo (shuffled states)", 2, 0.005, 0.10, (), None),
    ("ft", "DSpark + FT", 1, 0.01, 0.10, (), None),
    ("ar", "AR", -1, None, 0.30, (), None),
]
MAIN_ROWS = [("ar", "AR", 0, None, 0.30, (), None), ("dspark", "DSpark", 1, 0.0, 0.10, (), None),
             ("ready", "ReaDy", 2, 0.12, 0.08, (), -0.10)]


@functools.lru_cache(maxsize=None)
def logs(rows: tuple, device: str) -> dict[tuple[str, int], dict]:
    """(label, seed) -> evaluation.json of each row and seed (2 seeds), gains exact per benchmark."""
    out = {}
    for seed in (0, 1):
        ds = {b: bench_rounds(100 + 10 * seed + i, PROMPTS, ROUNDS) for i, b in enumerate(BENCHES)}
        for method, label, order, gain, wall, bad, swap in rows:
            if method == "ar":
                out[label, seed] = evaluation("ar", {b: [[0] * 60] * PROMPTS for b in BENCHES}, k=0, wall_s=wall,
                                              device=device)
                continue
            rounds = ds if method == "dspark" else {
                b: bench_rounds(200 + 7 * order + 10 * seed + i, PROMPTS, ROUNDS,
                                gain[seed] if isinstance(gain, tuple) else gain, ds[b]) for i, b in enumerate(BENCHES)}
            swapped = None if swap is None else {b: bench_rounds(900 + seed, PROMPTS, ROUNDS, swap, r) for b, r in rounds.items()}
            out[label, seed] = evaluation(method, rounds, device=device, wall_s=wall, swapped=swapped,
                                          lossless=0 if seed in bad else 1)
    return out


def _log(client, exp_id, parent_id, sweep, table, *, method, label, order, seed, metrics, status="FINISHED",
         evaluation_json=None):
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
    if "overall/lossless" in metrics:
        tags["ready.lossless"] = str(int(metrics["overall/lossless"]))
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
    if evaluation_json is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp, "evaluation.json")
            path.write_text(json.dumps(evaluation_json))
            client.log_artifact(run.info.run_id, str(path))
    client.set_terminated(run.info.run_id, status=status)


def _logged_sweep(client, sweep, table, rows, device):
    """A sweep whose runs carry evaluation.json, with the metrics the pipeline derives from it."""
    exp_id = ensure_experiment(client, sweep)  # its artifacts beside the store, under tmp
    parent = client.create_run(exp_id, tags={"ready.kind": "sweep", "ready.sweep": sweep})
    for method, label, order, *_ in rows:
        for seed in (0, 1):
            ev = logs(tuple(rows), device)[label, seed]
            _log(client, exp_id, parent.info.run_id, sweep, table, method=method, label=label, order=order,
                 seed=seed, metrics=metrics_of(ev), evaluation_json=ev)
    client.set_terminated(parent.info.run_id)


def _sweep(client, sweep, table, variants):
    exp_id = ensure_experiment(client, sweep)  # its artifacts beside the store, under tmp
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
    # Table 3 from per-prompt logs (CPU), 2 seeds
    _logged_sweep(client, "rank", "table3", RANK_ROWS, "cpu")
    # a Table-1 sweep from per-prompt logs, timed on CUDA
    _logged_sweep(client, "main_logs", "table1", MAIN_ROWS, "cuda")
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


def _pooled(sweep_rows, device, label, ref=None, metric="tau", seeds=(0, 1)):
    """What the table should show for `label`: from the logs, with reports.stats directly."""
    t = {k: stats.tallies(v) for k, v in logs(tuple(sweep_rows), device).items()}
    if ref is None:
        return stats.tau([t[label, s] for s in seeds], "overall")
    return stats.gain_pct([t[label, s] for s in seeds], [t[ref, s] for s in seeds], "overall", metric)


def _text(iv, decimals=1, signed=True):
    f = (lambda x: f"{x:+.{decimals}f}") if signed else (lambda x: f"{x:.{decimals}f}")
    return f"{f(iv.value)} [{f(iv.lo)}, {f(iv.hi)}]"


def test_ablation_rows_follow_ready_order_with_dspark_reference_then_controls(store):
    table = build_table("rank", load_runs(store, "rank"))
    assert [r[0].text for r in table.rows] == ["DSpark", "DSpark + FT", "Placebo (shuffled states)", "r=8", "r=16",
                                               "r=32", "r=128"]  # no AR row
    assert table.spec.name == "table3" and table.seeds == (1, 2) and table.models == [MODEL]


def test_rank_cells_are_paired_intervals_from_the_logged_evaluations(built):
    out, _ = built
    rows = _rows((out / "table3.md").read_text())
    # τ pooled over both seeds' prompts; gains paired by prompt and seed, exactly +10 % / +1 % by construction
    r8, r16 = _pooled(RANK_ROWS, "cpu", "r=8", "DSpark"), _pooled(RANK_ROWS, "cpu", "r=16", "DSpark")
    assert r8.value == pytest.approx(10.0, abs=0.05) and r16.value == pytest.approx(1.0, abs=0.05)
    assert rows["r=8"][0] == _text(_pooled(RANK_ROWS, "cpu", "r=8"), 3, signed=False)
    # +10 % over 2 seeds × 16 prompts excludes 0 and survives Holm over the table: marked
    assert r8.lo > 0 and rows["r=8"][1] == _text(r8) + r"\*"
    assert rows["r=16"][1] == _text(r16)  # 1 % over ~960 rounds: noise, unmarked
    assert rows["r=8"][2] == _text(_pooled(RANK_ROWS, "cpu", "r=8", "DSpark + FT")) + r"\*"
    assert rows["DSpark"][1:3] == ["ref.", ""] and rows["DSpark + FT"][2] == "ref."
    assert rows["DSpark + FT"][3] == "" and rows["r=8"][3].startswith("+0.")  # state reliance: ReaDy rows only
    # r=128 (+25 %) beats every other row paired but r=32, whose one lossless seed leaves 16 units: a thin
    # comparison, no win, so nothing is bold; its 2x TPS is CPU timing, never bold
    assert rows["r=128"][1] == _text(_pooled(RANK_ROWS, "cpu", "r=128", "DSpark")) + r"\*"
    t = {k: stats.tallies(v) for k, v in logs(tuple(RANK_ROWS), "cpu").items()}
    assert stats.gain_pct([t["r=128", 0]], [t["r=32", 0]], "overall").thin
    assert sum("**" in c for row in rows.values() for c in row) == 0
    assert rows["r=128"][5] == _text(_pooled(RANK_ROWS, "cpu", "r=128", "DSpark", "tps"))  # CPU timing: no mark
    assert "999" not in (out / "table3.tex").read_text()  # logged gains are not trusted


def test_a_not_lossless_seed_is_left_out_and_footnoted(built):
    out, _ = built
    md = (out / "table3.md").read_text()
    rows = _rows(md)
    # r=32's seed 1 (+50 %) was not lossless: the row is seed 0 alone (+5 %), paired with DSpark's seed 0
    r32 = _pooled(RANK_ROWS, "cpu", "r=32", "DSpark", seeds=(0,))
    assert r32.value == pytest.approx(5.0, abs=0.05)
    # one seed × 16 prompts: fewer than reports.stats.MIN_DISCORDANT differing units, a count and no interval
    assert r32.thin and rows["r=32‡"][1] == f"{r32.value:+.1f} ({r32.discordant} of 16 differ)"
    assert "‡ Not lossless: r=32: seed(s) 1 not lossless (speculative output differed from AR greedy); left out" in md
    assert r"r=32$^{\ddagger}$" in (out / "table3.tex").read_text()


def test_latex_table_uses_booktabs_bold_caption_and_label(built):
    out, _ = built
    tex = (out / "table3.tex").read_text()
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\cmidrule(lr){2-5}", r"\cmidrule(lr){6-7}"):
        assert rule in tex
    assert r"\begin{tabular}{lrrrrrr}" in tex and "|" not in tex.split(r"\begin{tabular}")[1]
    r8, r128 = _pooled(RANK_ROWS, "cpu", "r=8", "DSpark"), _pooled(RANK_ROWS, "cpu", "r=128", "DSpark")
    assert rf"${r8.value:+.1f}\;[{r8.lo:+.1f}, {r8.hi:+.1f}]^{{*}}$" in tex  # marked after Holm
    assert rf"${r128.value:+.1f}\;[{r128.lo:+.1f}, {r128.hi:+.1f}]^{{*}}$" in tex
    assert tex.count(r"\mathbf{") == 0  # r=128 vs r=32 is thin (one seed × 16 prompts): no bold
    assert r"\label{tab:ready-rank}" in tex
    wide = (out / "table1.tex").read_text()  # 12 columns: a two-column float scaled to the text width
    assert r"\begin{table*}" in wide and r"\resizebox{\textwidth}{!}{%" in wide
    caption = tex.split(r"\caption{")[1].split("\n")[0]
    assert r"\texttt{rank}" in caption and rf"\texttt{{{latex.escape(MODEL)}}}" in caption and "1--2 seeds" in caption
    assert rf"1--2 seeds $\times$ {2 * PROMPTS} prompts $\times$ 480--960 rounds" in caption
    assert "CPU timing, indicative: TPS is not ranked" in caption
    first = (out / "table3.md").read_text().splitlines()[0]  # the Markdown says the same
    assert f"1–2 seeds × {2 * PROMPTS} prompts × 480–960 rounds" in first and "CPU timing, indicative" in first


def test_main_table_per_benchmark_and_all_prompts_pooled(built):
    out, _ = built
    md = (out / "table1.md").read_text()
    rows = _rows(md)
    assert list(rows)[1:] == ["HumanEval", "Held-out", "All prompts"]  # bench.suites order, then all pooled
    # columns: AR TPS × τ | DSpark TPS × τ | ReaDy TPS × τ | gain TPS τ
    # HumanEval: AR 50; DSpark 155 ± 7.07, 155/50 = 3.10×, τ 4.10; ReaDy 168 ± 4.24, 3.36×, τ 4.50
    # gains 168/155 - 1 = +8.4 %, 4.5/4.1 - 1 = +9.8 %; no interval (metrics only), so nothing bold
    assert rows["HumanEval"] == [
        "50.00 ± 0.00", "1.00×", "1.00 ± 0.00",
        "155.00 ± 7.07", "3.10×", "4.10 ± 0.14",
        "168.00 ± 4.24", "3.36×", "4.50 ± 0.14",
        "+8.4", "+9.8",
    ]
    # without per-prompt logs the last row is each run's logged overall/<m> (here the suites' mean, as the
    # fixture logs it), then the mean over seeds: AR (45, 47), DSpark (125, 135), ReaDy (136.5, 143.5);
    # 130/46 = 2.83×, 140/46 = 3.04×, 140/130 - 1 = +7.7 %; τ DSpark 3.60, ReaDy 3.95: +9.7 %
    assert rows["All prompts"] == [
        "46.00 ± 1.41", "1.00×", "1.00 ± 0.00",
        "130.00 ± 7.07", "2.83×", "3.60 ± 0.14",
        "140.00 ± 4.95", "3.04×", "3.95 ± 0.14",
        "+7.7", "+9.7",
    ]
    assert "Missing" not in md and "No per-prompt logs (evaluation.json)" in md.splitlines()[0]


def test_main_table_from_logs_has_paired_intervals_per_benchmark_and_all_prompts_pooled(built):
    out, _ = built
    md = (out / "table1_main_logs.md").read_text()
    rows = _rows(md)
    t = {k: stats.tallies(v) for k, v in logs(tuple(MAIN_ROWS), "cuda").items()}
    ready, ds = [t["ReaDy", s] for s in (0, 1)], [t["DSpark", s] for s in (0, 1)]
    for name, key in (("HumanEval", "humaneval"), ("Held-out", "heldout")):
        tau, tps = stats.gain_pct(ready, ds, key), stats.gain_pct(ready, ds, key, "tps")
        assert tau.value == pytest.approx(12.0, abs=0.05)  # +12 % on each benchmark and seed by construction
        # 16 prompt × seed units per suite: too few for an interval (thin), a count, never bold or marked
        assert tau.thin and rows[name][-1] == f"{tau.value:+.1f} (16 of 16 differ)"
        assert tps.thin and rows[name][-2] == f"{tps.value:+.1f} (16 of 16 differ)"
    tau, tps = stats.gain_pct(ready, ds, "overall"), stats.gain_pct(ready, ds, "overall", "tps")
    # pooled over 32 units: ReaDy's TPS and τ beat DSpark's paired on CUDA, bold and marked after Holm
    assert rows["All prompts"][-2] == f"**{_text(tps)}**" + r"\*"
    assert tau.lo > 0 and rows["All prompts"][-1] == f"**{_text(tau)}**" + r"\*"
    # the pooled row's τ and TPS pool every prompt of both suites per run, then average the seeds
    pooled = [stats.point([t["ReaDy", s]], "overall") for s in (0, 1)]
    assert rows["All prompts"][8].startswith(f"**{sum(pooled) / 2:.2f} ± ")
    first = md.splitlines()[0]
    assert f"Per cell: 2 seeds × {PROMPTS}–{2 * PROMPTS} prompts × " in first and "CPU" not in first


def test_missing_run_and_metric_render_dashes_and_footnotes(built):
    out, _ = built
    md = (out / "table4.md").read_text()
    rows = _rows(md)
    # columns: τ | Δτ vs DSpark | Δτ vs FT | state reliance | TPS | ΔTPS; no FT row, no state swap, no logs
    assert rows["DSpark"] == ["4.000", "ref.", "", "", "100.00", "ref."]
    assert rows["{62}"] == ["4.300", "+7.5", "—†", "—†", "—†", "—†"]  # 4.3/4.0 - 1; TPS never logged
    assert rows["{30,62}"] == ["—†"] * 6  # its only run failed
    assert rows["{2,30,62}"] == ["4.200", "+5.0", "—†", "—†", "103.00", "+3.0"]  # no interval: nothing bold
    for note in ("{62}: metric overall/tps not logged in any run", "{30,62}: no finished run (status FAILED)",
                 "no DSpark + FT run in sweep layers: gains vs FT not computed",
                 "no state-swap decode logged in sweep layers: state reliance not computed"):
        assert f"† Missing: {note}." in md or f"† Missing: " in md and note in md
    tex = (out / "table4.tex").read_text()
    assert r"--$^{\dagger}$" in tex and r"\{30,62\}: no finished run (status FAILED)" in tex


def test_main_table_with_missing_baseline_and_benchmark(built):
    out, _ = built
    md = (out / "table1_main_gaps.md").read_text()
    rows = _rows(md)
    # no AR run: AR cells and every speedup are dashes; DSpark vs ReaDy still compare (66/60 - 1 = +10.0)
    assert rows["HumanEval"] == ["—†"] * 3 + ["60.00", "—†", "5.00"] + ["66.00", "—†", "5.50"] + ["+10.0", "+10.0"]
    assert rows["Held-out"] == ["—†"] * 3 + ["50.00", "—†", "4.00"] + ["—†"] * 3 + ["—†", "—†"]
    assert rows["All prompts"] == ["—†"] * 3 + ["55.00", "—†", "4.50"] + ["—†"] * 3 + ["—†", "—†"]
    for note in ("no AR run in sweep main_gaps: speedups not computed", "ReaDy: metric heldout/tps not logged in any run",
                 "ReaDy: All prompts needs every benchmark"):
        assert note in md


def test_sweep_without_dspark_keeps_a_dash_reference_row(built):
    out, _ = built
    md = (out / "table6.md").read_text()
    assert _rows(md)["DSpark"] == ["—†", "—†", "", "", "—†", "—†"]
    assert _rows(md)["post"] == ["4.500", "—†", "—†", "—†", "110.00", "—†"]
    assert "no DSpark run in sweep inject_pos: gains not computed" in md


def test_survival_curves_average_seeds_per_position(store):
    curves = survival_curves(load_runs(store, "main"))
    assert list(curves) == ["humaneval", "heldout"]
    ds, rd = curves["humaneval"]
    assert (ds.label, rd.label) == ("DSpark", "ReaDy")
    assert ds.positions == (1, 2, 3)
    assert ds.mean == pytest.approx((0.8, 0.55, 0.35))
    assert rd.mean == pytest.approx((0.9, 0.7, 0.5))
    assert ds.lo == () and ds.std[0] == pytest.approx(0.0)  # metrics only: a ± std band


def test_survival_curves_get_95_percent_bands_from_the_per_prompt_logs(store, tmp_path):
    runs = load_runs(store, "main_logs")
    evaluations = load_evaluations(store, runs, tmp_path)
    assert len(evaluations) == 6 and sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(evaluations)
    ds, rd = survival_curves(runs, evaluations)["heldout"]
    t = [stats.tallies(logs(tuple(MAIN_ROWS), "cuda")["ReaDy", s]) for s in (0, 1)]
    band = stats.survival(t, "heldout")
    assert rd.mean == tuple(iv.value for iv in band) and rd.lo == tuple(iv.lo for iv in band)
    assert rd.hi == tuple(iv.hi for iv in band) and all(lo < m < hi for lo, m, hi in zip(rd.lo, rd.mean, rd.hi))
    assert len(ds.lo) == 7


def test_figure_and_every_table_file_are_written(built):
    out, paths = built
    names = sorted(p.name for p in paths)
    for stem in ("table1", "table3", "table4", "table6", "table1_main_gaps", "table1_main_logs"):
        assert f"{stem}.tex" in names and f"{stem}.md" in names
    pdf, png = out / "fig5_survival.pdf", out / "fig5_survival.png"
    assert pdf.read_bytes()[:5] == b"%PDF-" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*tmp*"))  # atomic writes leave no temp files
    cached = sorted(p.stem for p in (out / ".cache" / "evaluations").glob("*.json"))
    assert len(cached) == 2 * len(RANK_ROWS) + 2 * len(MAIN_ROWS)  # every run with an evaluation.json, once


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
    for stem in ("table1", "table3", "table4", "table6", "table1_main_gaps", "table1_main_logs"):
        shutil.copy(out / f"{stem}.tex", tmp_path / f"{stem}.tex")
        text = _compile(tmp_path, f"\\input{{{stem}}}")
        assert "Table 1: " in text  # the caption
        if stem == "table3":
            r8 = _pooled(RANK_ROWS, "cpu", "r=8", "DSpark")
            assert f"{r8.value:+.1f} [{r8.lo:+.1f}, {r8.hi:+.1f}]" in text and "Sweep rank" in text
            assert "CPU timing, indicative" in text and "Not lossless: r=32: seed(s) 1 not lossless" in text
        if stem == "table4":
            assert "{62}: metric overall/tps not logged in any run." in text
            assert "{30,62}: no finished run (status FAILED)." in text


@needs_tex
def test_cli_fragment_prints_markdown_and_compiles_inside_a_table(store, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--tracking-uri", store, "--sweep", "rank", "--out", str(out), "--fragment"]) == 0
    printed = capsys.readouterr().out
    r8 = _pooled(RANK_ROWS, "cpu", "r=8", "DSpark")
    # the pooled values (whether the cell is marked is Holm's business over the table: test_reports_tables)
    assert f"| r=8 | {_text(_pooled(RANK_ROWS, 'cpu', 'r=8'), 3, signed=False)} | {_text(r8)}" in printed
    tex = (out / "table3.tex").read_text()
    assert tex.lstrip("%").count(r"\begin{table}") == 0 and r"\caption" not in tex.replace("% caption", "")
    # the rank sweep's survival figure is not used: Figure 5 comes from the store's main sweep
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "fig5_survival.pdf", "fig5_survival.png", "table3.md", "table3.tex"]
    assert "fig5_survival: sweep main ->" in printed
    text = _compile(out, "\\begin{table}\\centering\\caption{By hand}\\resizebox{\\textwidth}{!}{\\input{table3}}\\end{table}")
    assert "By hand" in text and f"{r8.value:+.1f} [{r8.lo:+.1f}, {r8.hi:+.1f}]" in text


def test_no_survival_anywhere_skips_the_figure_with_a_message(store, tmp_path, monkeypatch):
    import reports.build

    assert survival_curves(load_runs(store, "layers")) == {}  # DSpark and ReaDy rows, no survival metrics
    monkeypatch.setattr(reports.build, "MAIN_SWEEP", "no-such-sweep")  # do not fall back to `main`
    messages = []
    paths = build_reports(store, ["layers", "inject_pos"], tmp_path, echo=messages.append)
    tables = [p.name for p in paths if p.stem != "tables"]  # tables.tex (+ .pdf): the document of them all
    assert sorted(tables) == ["table4.md", "table4.tex", "table6.md", "table6.tex"]
    assert any(m.startswith("fig5_survival: not written; no sweep among layers, inject_pos has survival metrics")
               for m in messages) and messages[-1].startswith("tables.pdf: ")


def test_unknown_sweep_and_missing_store_are_one_clear_error(store, tmp_path, capsys):
    with pytest.raises(ReportError, match=r"sweep 'nope': no MLflow experiment 'ready-nope'.*sweeps found: inject_pos, layers, main, main_gaps, main_logs, rank"):
        build_reports(store, ["nope"], tmp_path, echo=None)
    assert main(["--tracking-uri", f"sqlite:///{tmp_path}/absent.db", "--out", str(tmp_path)]) == 2
    assert "no MLflow database at" in capsys.readouterr().err


def test_findings_print_each_comparisons_mde_and_judge_saturation_by_equivalence(store):
    from reports.findings import FINDINGS, finding_section

    rank = next(f for f in FINDINGS if f.sweep == "rank")
    text = finding_section(rank, [store], None)
    assert "| comparison | Δτ engine (%) [95 % CI] | MDE 80 % (df) |" in text
    t = {k: stats.tallies(v) for k, v in logs(tuple(RANK_ROWS), "cpu").items()}
    iv = stats.gain_pct([t["r=128", s] for s in (0, 1)], [t["r=8", s] for s in (0, 1)], "overall")
    row = next(line for line in text.splitlines() if line.startswith("| r=128 vs r=8 |"))
    assert f"| {iv.mde():.2f} (df {iv.df:.1f}) |" in row
    # r=128 gains ~+14 % over r=8 here: far above the ±1 % margin, whatever the MDE
    assert iv.lo > 1.0 and row.endswith("| within ±1 %: does not (interval outside ±1 %) |")


def test_findings_on_one_suite_pair_that_suites_prompts_only(store):
    from reports.findings import FINDINGS, finding_section

    rank = next(f for f in FINDINGS if f.sweep == "rank")
    t = {k: stats.tallies(v) for k, v in logs(tuple(RANK_ROWS), "cpu").items()}
    for suite in BENCHES:
        text = finding_section(rank, [store], None, suite=suite)
        iv = stats.gain_pct([t["r=128", s] for s in (0, 1)], [t["r=8", s] for s in (0, 1)], suite)
        row = next(line for line in text.splitlines() if line.startswith("| r=128 vs r=8 |"))
        # one suite: 2 seeds × 8 prompts, a thin comparison read by its sign test
        assert iv.thin and row.startswith(f"| r=128 vs r=8 | {iv.value:+.2f} ({iv.discordant} of {iv.units} units differ")
        assert f"--suite {suite}" in text
    pooled = stats.gain_pct([t["r=128", s] for s in (0, 1)], [t["r=8", s] for s in (0, 1)], "overall")
    assert f"{pooled.value:+.2f}" not in next(line for line in text.splitlines() if line.startswith("| r=128 vs r=8 |"))


def test_without_pdflatex_build_says_so_and_writes_the_document_to_compile(store, tmp_path, monkeypatch, capsys):
    import reports.build as build

    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert main(["--tracking-uri", store, "--sweep", "rank", "--out", str(tmp_path)]) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tables.pdf")]
    assert said == [f"tables.pdf: not compiled: pdflatex is not on PATH (Debian/Ubuntu: apt-get install "
                    f"texlive-latex-base texlive-latex-recommended); the .tex files are written ({tmp_path / 'tables.tex'})"]
    assert r"\input{table3}" in (tmp_path / "tables.tex").read_text() and not (tmp_path / "tables.pdf").exists()


@needs_tex
def test_with_pdflatex_build_compiles_every_table_and_figure_into_one_pdf(store, tmp_path, capsys):
    assert main(["--tracking-uri", store, "--out", str(tmp_path)]) == 0
    (said,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tables.pdf")]
    assert said.startswith("tables.pdf: compiled by pdflatex from tables.tex (") and said.endswith(str(tmp_path / "tables.pdf"))
    assert (tmp_path / "tables.pdf").read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".aux", ".log")) == []  # pdflatex's own files stay in a temp folder


def test_findings_without_out_only_reads(store, tmp_path, capsys):
    """`reports.findings` prints; it writes nothing (no evaluation cache) unless --out asks for a file."""
    from reports.findings import main as findings

    cache = tmp_path / "cache"
    assert findings(["--tracking-uri", store, "--cache-dir", str(cache)]) == 0
    assert "## Rank 8 is near saturation" in capsys.readouterr().out
    assert not cache.exists()
    assert findings(["--tracking-uri", store, "--cache-dir", str(cache), "--out", str(tmp_path / "f.md")]) == 0
    assert (tmp_path / "f.md").is_file() and len(list(cache.glob("*.json"))) == 2 * len(RANK_ROWS)
