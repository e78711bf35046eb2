"""Reports over what the real sweep runner writes: after `python -m sweeps.run rank` (with the cheap
injected run function of tests/test_sweeps_fake_runner.py), `python -m reports.build` writes a
table3.tex with one row per rank holding the values MLflow holds."""

import pytest

from reports.build import main as build
from reports.collect import load_runs


def test_rank_sweep_writes_table3_with_one_row_per_rank(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from sweeps.run import main as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FAKE_RUN_LOG", raising=False)
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "out"
    assert sweep(["rank", "--runner", "test_sweeps_fake_runner", "--tracking-uri", uri, "--no-report", "--quiet"]) == 0
    assert build(["--tracking-uri", uri, "--out", str(out)]) == 0

    tex = (out / "table3.tex").read_text()
    body = tex.split(r"\midrule", 1)[1].split(r"\bottomrule")[0]
    rows = [line.split(" & ") for line in body.splitlines() if " & " in line]
    assert [r[0] for r in rows] == ["DSpark", "r=8", "r=16", "r=32", "r=64", "r=128"]

    client = MlflowClient(tracking_uri=uri)
    by_label = {r["ready.label"]: r["run_id"] for r in load_runs(uri, "rank").iter_rows(named=True)}
    ds = client.get_run(by_label["DSpark"]).data.metrics
    for row in rows:
        m = client.get_run(by_label[row[0]]).data.metrics
        assert f"{m['overall/tau']:.4f}" in row[1] and f"{m['overall/tps']:.2f}" in row[2]
        if row[0] != "DSpark":
            gain = 100 * (m["overall/tau"] / ds["overall/tau"] - 1)
            assert f"{gain:+.2f}" in row[3]
    assert "Missing" not in tex
    assert (out / "table3.md").is_file() and (out / "fig5_survival.pdf").is_file()


@pytest.fixture(autouse=True)
def _fake_runner_importable(monkeypatch):
    """The runner imports its run function by module name from tests/."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
