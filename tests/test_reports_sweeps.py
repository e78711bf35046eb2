"""Reports over what the real sweep runner writes: after `python -m sweeps.run rank` (with the cheap
injected run function of tests/test_sweeps_fake_runner.py), `python -m reports.build` writes a
table3.tex with the reference, the two controls and one row per rank, holding the values MLflow holds."""

from pathlib import Path

import pytest

from reports.build import main as build
from reports.collect import load_runs


def test_rank_sweep_writes_table3_with_one_row_per_rank(tmp_path, monkeypatch):
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
    assert [r[0] for r in rows] == ["DSpark", "DSpark + FT", "Placebo (shuffled states)",
                                    "r=8", "r=16", "r=32", "r=64", "r=128"]

    runs = load_runs(uri, "rank")
    tau = {label: runs.filter(runs["ready.label"] == label)["overall/tau"].mean() for label in runs["ready.label"]}
    for row in rows:
        assert f"{tau[row[0]]:.3f}" in row[1]  # τ: mean over the seeds the runner ran
        if row[0] != "DSpark":  # no per-prompt logs from this runner: a ratio of seed means
            assert f"{100 * (tau[row[0]] / tau['DSpark'] - 1):+.1f}" in row[2]
    notes = [line for line in (out / "table3.md").read_text().splitlines() if line.startswith("†")]
    assert notes == ["† Missing: no state-swap decode logged in sweep rank: state reliance not computed."]  # fake runs
    assert (out / "table3.md").is_file() and (out / "fig5_survival.pdf").is_file()


def test_a_sweeps_closing_lines_print_commands_that_run_as_printed(tmp_path, monkeypatch, capsys):
    """The end of a sweep names the command that opens its runs in MLflow's UI and the sweeps the other
    findings read (those not run yet with the command that runs each); the UI's command runs as printed."""
    import shlex
    import subprocess
    import sys

    from sweeps.run import main as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FAKE_RUN_LOG", raising=False)
    uri = f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}"  # not the default store: the commands name it
    assert sweep(["rank", "seeds=[0]", "--runner", "test_sweeps_fake_runner", "--tracking-uri", uri,
                  "--reports-dir", str(tmp_path / "out"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (ui,) = [ln.split("compare the runs: ", 1)[1] for ln in lines if "compare the runs: " in ln]
    (findings,) = [ln for ln in lines if "the paper's findings: " in ln]
    assert ui.endswith(f"ui rank --tracking-uri {uri}")
    assert "judges them from sweeps positive_control, ft_control, rank, layers, inject_layer, inject_pos" in findings
    missing = findings.split("; not run yet: ", 1)[1].split("; ")
    assert [m.split(" sweep ", 1)[1] for m in missing] == [f"{s} --tracking-uri {uri}" for s in
                                                          ("positive_control", "ft_control", "layers", "inject_layer",
                                                           "inject_pos")]  # rank is in the store
    ran = subprocess.run([*shlex.split(ui), "--print"], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr
    assert f"-m mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000" in ran.stdout
    assert "?workflowType=machine_learning" in ran.stdout


def test_ready_ui_refuses_a_store_that_does_not_exist_in_one_line(tmp_path, capsys):
    from sweeps.ui import main as ui

    assert ui(["--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: tracking URI 'sqlite:///{tmp_path / 'none.db'}': ") and "does not exist" in line
    assert not (tmp_path / "none.db").exists()


def test_a_command_is_spelled_as_it_runs_in_this_shell(monkeypatch):
    import shutil
    import sys

    from sweeps.ui import command

    script = Path(sys.executable).parent / "ready"
    if not script.is_file():
        pytest.skip("no console script `ready` beside this interpreter (not an installed environment)")
    monkeypatch.setattr(shutil, "which", lambda name: str(script))
    assert command("ui rank") == "ready ui rank"  # the `ready` on PATH is this environment's
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert command("ui rank").endswith(f"{Path(sys.executable).parent.name}/ready ui rank")  # not on PATH: its path


@pytest.fixture(autouse=True)
def _fake_runner_importable(monkeypatch):
    """The runner imports its run function by module name from tests/."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))


def test_each_run_knows_the_profile_its_sweep_ran_with(tmp_path, monkeypatch):
    """Child runs get `ready.profile` from their sweep's run, so findings can read one profile's runs."""
    from sweeps.run import main as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FAKE_RUN_LOG", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["--runner", "test_sweeps_fake_runner", "--tracking-uri", uri, "--no-report", "--quiet"]
    assert sweep(["inject_pos", "seeds=[0]", *args]) == 0
    assert sweep(["inject_pos", "seeds=[0]", "profile=state_context", *args]) == 0
    runs = load_runs(uri, "inject_pos")
    by_profile = {p: runs.filter(runs["ready.profile"] == p)["ready.setting"].unique().to_list()
                  for p in ("", "state_context")}
    assert runs["ready.profile"].null_count() == 0
    assert len(by_profile[""]) == 1 and len(by_profile["state_context"]) == 1
    assert by_profile[""] != by_profile["state_context"]
