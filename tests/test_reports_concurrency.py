"""The TPS-vs-concurrency figure (reports.concurrency): hand-made runs logged into a temporary MLflow
store the way sweeps/ logs them (one sweep setting per `eval.concurrency`, params = the resolved
config). The `rank` sweep ran its rows at concurrency 1 (runs from before the key existed), at 4
(the newest setting, the one the tables report) and, earlier, a smoke setting at 2 with other
budgets; the `layers` sweep ran two settings, both at concurrency 1."""

import statistics

import pytest

from reports.build import build_reports
from reports.collect import load_runs
from reports.concurrency import tps_by_concurrency
from reports.mlflow_store import ensure_experiment

# sweep -> settings, oldest first: (setting, eval.concurrency param (None: predates the key), bench.limit,
# rows: (method, label, order, overall/tps per seed; a (tps, 0) pair is a run that was not lossless))
SWEEPS = {
    "rank": ("table3", [
        ("smoke", 2, 2, [("dspark", "DSpark", 1, [999.0]), ("ready", "r=8", 2, [999.0])]),
        ("c1", None, 8, [("ar", "AR", 0, [50.0]), ("dspark", "DSpark", 1, [100.0, 110.0]),
                         ("ready", "r=8", 2, [98.0, 104.0])]),
        ("c4", 4, 8, [("ar", "AR", 0, [150.0]), ("dspark", "DSpark", 1, [300.0, 320.0]),
                      ("ready", "r=8", 2, [295.0, 305.0, (900.0, 0)])]),
    ]),
    "layers": ("table4", [
        ("old", None, 8, [("dspark", "DSpark", 1, [100.0]), ("ready", "{62}", 2, [101.0])]),
        ("new", 1, 8, [("dspark", "DSpark", 1, [102.0]), ("ready", "{62}", 2, [103.0])]),
    ]),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pytest.importorskip("mlflow")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    clock = 1_700_000_000_000
    for sweep, (table, settings) in SWEEPS.items():
        exp = ensure_experiment(client, sweep)  # its artifacts beside the store, under tmp
        for setting, conc, limit, rows in settings:
            for method, label, order, per_seed in rows:
                for seed, value in enumerate(per_seed):
                    tps, lossless = value if isinstance(value, tuple) else (value, 1)
                    variant = f"{setting}-{label}"  # eval.concurrency is hashed: each setting has its own ids
                    clock += 1000
                    run = client.create_run(exp, start_time=clock, tags={
                        "ready.kind": "variant", "ready.sweep": sweep, "ready.table": table, "ready.setting": setting,
                        "ready.method": method, "ready.label": label, "ready.order": str(order),
                        "ready.variant_id": variant, "ready.config_hash": f"{variant}-{seed}", "ready.model": "tiny-test",
                        "ready.seed": str(seed), "ready.lossless": str(lossless)})
                    params = {"seed": str(seed), "name": f"{sweep}:{label}", "bench.limit": str(limit),
                              "target.device": "cpu", "reader.rank": "8"}
                    if conc is not None:
                        params["eval.concurrency"] = str(conc)
                    metrics = {"overall/tps": tps, "overall/tau": 1.0 if method == "ar" else 4.0 + tps / 1000,
                               "overall/lossless": float(lossless)}
                    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                                     params=[Param(k, v) for k, v in params.items()])
                    client.set_terminated(run.info.run_id, end_time=clock + 500)
    return uri


def test_two_concurrencies_give_one_line_per_row_mean_over_lossless_seeds(store):
    data = tps_by_concurrency(load_runs(store, "rank"))
    assert data is not None and data.concurrencies == (1, 4)
    got = {line.label: {p.concurrency: (p.mean, p.std, p.n, p.setting) for p in line.points} for line in data.lines}
    assert list(got) == ["AR", "DSpark", "r=8"]  # ready.order
    assert got["AR"] == {1: (50.0, None, 1, "c1"), 4: (150.0, None, 1, "c4")}
    assert got["DSpark"] == {1: (105.0, statistics.stdev([100.0, 110.0]), 2, "c1"),
                             4: (310.0, statistics.stdev([300.0, 320.0]), 2, "c4")}
    # seed 2 at concurrency 4 was not lossless: left out, as in the tables
    assert got["r=8"] == {1: (101.0, statistics.stdev([98.0, 104.0]), 2, "c1"),
                          4: (300.0, statistics.stdev([295.0, 305.0]), 2, "c4")}
    # the smoke setting (concurrency 2, other budgets) must not be drawn beside the full runs
    assert len(data.notes) == 1 and data.notes[0].startswith("setting smoke (concurrency 2) left out")
    assert "bench.limit" in data.notes[0]
    assert [line.method for line in data.lines] == ["ar", "dspark", "ready"]


def test_one_concurrency_draws_nothing(store):
    runs = load_runs(store, "layers")
    assert runs["ready.setting"].n_unique() == 2  # two settings, both at concurrency 1 (one predates the key)
    assert tps_by_concurrency(runs) is None


def test_build_writes_the_figure_with_a_cpu_note_and_tables_keep_the_newest_setting(store, tmp_path):
    messages = []
    paths = build_reports(store, None, tmp_path, echo=messages.append)
    names = sorted(p.name for p in paths)
    assert "fig_tps_concurrency_rank.pdf" in names and "fig_tps_concurrency_rank.png" in names
    assert not [n for n in names if "layers" in n and n.startswith("fig_")]  # one concurrency: no figure
    assert (tmp_path / "fig_tps_concurrency_rank.pdf").read_bytes()[:5] == b"%PDF-"
    assert (tmp_path / "fig_tps_concurrency_rank.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    said = [m for m in messages if m.startswith("fig_tps_concurrency_rank: sweep rank")]
    assert len(said) == 1 and "concurrency 1, 4; CPU timing, indicative only" in said[0]
    assert any("setting smoke (concurrency 2) left out" in m for m in messages)
    # the table still reports only the newest setting: r=8 at concurrency 4, its lossless seeds
    row = next(line for line in (tmp_path / "table3.md").read_text().splitlines() if line.startswith("| r=8"))
    assert f"300.00 ± {statistics.stdev([295.0, 305.0]):.2f}" in row
