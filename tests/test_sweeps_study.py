"""The sweep runner end to end with a cheap injected run function (tests/test_sweeps_fake_runner.py):
MLflow runs follow the contract, re-runs skip finished rows and redo failed or interrupted
ones, and two worker processes on one study never run the same row (journal file storage and,
where a PostgreSQL server can be started here, PostgreSQL)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from fault_helpers import postgres_server
from ready.loading import inputs_identity
from sweeps import study as st
from sweeps import tracking
from sweeps.run import main
from sweeps.spec import load_sweep

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
RUNNER = "test_sweeps_fake_runner"


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory) -> Path:
    """An initialised mlflow.db (creating the schema takes seconds; copying it does not)."""
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    tracking.ensure_experiment(tracking.client(f"sqlite:///{path}"), "warmup")
    return path


@pytest.fixture
def ws(tmp_path: Path, mlflow_template: Path, monkeypatch) -> Path:
    """A working directory with its own mlflow.db; the fake runner logs to ws/calls.jsonl."""
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_RUN_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS)]))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "calls.jsonl").touch()
    return tmp_path


def calls(ws: Path, event: str = "start") -> list[dict]:
    return [json.loads(x) for x in (ws / "calls.jsonl").read_text().splitlines() if json.loads(x)["event"] == event]


def sweep_args(ws: Path, *extra: str) -> list[str]:
    return [*extra, "--runner", RUNNER, "--tracking-uri", f"sqlite:///{ws / 'mlflow.db'}", "--no-report", "--quiet"]


def child_runs(ws: Path, sweep: str, status: str | None = None) -> list:
    c = tracking.client(f"sqlite:///{ws / 'mlflow.db'}")
    exp = c.get_experiment_by_name(f"ready-{sweep}")
    filt = "tags.`ready.kind` = 'variant'" + (f" and attributes.status = '{status}'" if status else "")
    return list(c.search_runs([exp.experiment_id], filter_string=filt, max_results=1000))


def test_with_several_workers_the_base_drafters_of_the_seeds_are_built_side_by_side(ws: Path, monkeypatch):
    """What every seed shares is built once in this process, then one process per base seed builds its
    base drafter (all three at once for two workers: no core idles while the last one builds), each
    exactly once."""
    from sweeps.prepare import prepare_artifacts

    monkeypatch.setenv("FAKE_PREPARE_BARRIER", "3")  # each build ends only once all three have started
    sweep = load_sweep("inject_pos", ["seeds=[0,1,2]"])
    prepare_artifacts(RUNNER, sweep, progress=False, workers=2)
    common, bases = calls(ws, "prepare_common"), calls(ws, "prepare")
    assert [c["pid"] for c in common] == [os.getpid()]
    assert sorted(b["base_seed"] for b in bases) == [0, 1, 2]
    assert os.getpid() not in {b["pid"] for b in bases} and len({b["pid"] for b in bases}) == 3
    logged = [json.loads(x)["event"] for x in (ws / "calls.jsonl").read_text().splitlines()]  # in the order logged
    events = [e for e in logged if e in ("prepare", "prepare_end")]
    assert events == ["prepare"] * 3 + ["prepare_end"] * 3  # every build started before any ended: side by side
    monkeypatch.delenv("FAKE_PREPARE_BARRIER")
    prepare_artifacts(RUNNER, sweep, progress=False, workers=1)  # one worker: in this process, one after another
    assert {b["pid"] for b in calls(ws, "prepare")[3:]} == {os.getpid()}


def test_base_drafters_built_side_by_side_show_one_progress_bar_over_their_steps(ws: Path, capsys):
    """The builds run in other processes; their training steps reach one bar in the sweep's process."""
    from ready.train.stages import num_steps
    from sweeps.prepare import prepare_artifacts

    sweep = load_sweep("inject_pos", ["seeds=[0,1,2]"])
    prepare_artifacts(RUNNER, sweep, progress=True, workers=2)
    err = capsys.readouterr().err
    total = 3 * num_steps(sweep.common.train.base.samples, sweep.common.train.base.batch_size)
    assert "base drafters (3, 3 at a time)" in err and f"{total}/{total}" in err


def test_base_drafters_build_all_at_once_up_to_twice_the_workers():
    from sweeps.prepare import builds_at_once

    assert [builds_at_once(n, 2) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 3, 4, 2, 2]
    assert builds_at_once(3, 1) == 1  # one worker only ever gets here for one build


def test_child_runs_follow_the_mlflow_contract(ws: Path):
    assert main(sweep_args(ws, "rank", "seeds=[0]")) == 0
    runs = child_runs(ws, "rank", "FINISHED")
    sweep = load_sweep("rank", ["seeds=[0]"])
    assert sorted(r.data.tags["ready.config_hash"] for r in runs) == sorted(j.config_hash for j in sweep.jobs())
    c = tracking.client(f"sqlite:///{ws / 'mlflow.db'}")
    parents = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert len(parents) == 1 and c.get_run(parents.pop()).data.tags["ready.kind"] == "sweep"
    by_label = {r.data.tags["ready.label"]: r for r in runs}
    assert set(by_label) == {"AR", "DSpark", "DSpark + FT", "Placebo (shuffled states)", "r=8", "r=16", "r=32", "r=64",
                             "r=128"}
    r128 = by_label["r=128"]
    tags = r128.data.tags
    for key in ("ready.sweep", "ready.table", "ready.method", "ready.order", "ready.variant_id", "ready.model",
                "ready.seed", "ready.git_commit", "ready.resolved_layers"):
        assert tags[key], key
    assert (tags["ready.table"], tags["ready.method"], tags["ready.order"]) == ("table3", "ready", "8")
    made_from = json.loads(tags["ready.made_from"])  # what the setting hashes beside the config, for the record
    assert made_from == inputs_identity(sweep.common) and len(made_from["corpus"]) == 16
    assert tags["ready.python"] == platform.python_version() and tags["ready.torch"] == torch.__version__
    assert r128.data.params["reader.rank"] == "128" and r128.data.params["reader.layers"] == "[30, 62]"
    assert r128.data.params["reader.rank_resolved"] == "64" and tags["ready.resolved_rank"] == "64"
    m = r128.data.metrics
    for bench in ("humaneval", "heldout", "overall"):
        for name in ("tau", "tps", "speedup", "tau_gain_pct", "tps_gain_pct", "lossless", "survival_1",
                     "survival_7", "rounds", "new_tokens"):
            assert f"{bench}/{name}" in m, f"{bench}/{name}"
    assert m["overall/lossless"] == 1.0
    for name in ("tau_gain_pct", "tau_gain_vs_ft_pct", "tau_gain_vs_placebo_pct", "tau"):  # paired, with intervals
        assert m[f"overall/{name}_lo"] <= m[f"overall/{name}"] <= m[f"overall/{name}_hi"], name
    assert by_label["Placebo (shuffled states)"].data.tags["ready.method"] == "placebo"
    ar, ds = by_label["AR"].data.metrics, by_label["DSpark"].data.metrics
    assert m["heldout/speedup"] == pytest.approx(m["heldout/tps"] / ar["heldout/tps"])
    assert m["overall/tau_gain_pct"] == pytest.approx(100 * (m["overall/tau"] / ds["overall/tau"] - 1))
    assert by_label["AR"].data.tags["ready.method"] == "ar" and ar["overall/tau"] == 1.0
    history = c.get_metric_history(r128.info.run_id, "train/stage1/loss")
    assert [h.step for h in history] == [1, 2, 3]
    assert {a.path for a in c.list_artifacts(r128.info.run_id)} == {"config.yaml", "evaluation.json", "survival.png"}


def test_rerun_skips_finished_rows_and_reruns_failed_ones(ws: Path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_RUN_FAIL", "pre-attention")
    assert main(sweep_args(ws, "inject_pos", "seeds=[0]")) == 1
    assert Counter(c["name"] for c in calls(ws)) == Counter(  # AR, DSpark, FT and the placebo, then the two rows
        {"inject_pos": 4, "inject_pos:pre-attention": 1, "inject_pos:post-attention": 1})
    assert len(child_runs(ws, "inject_pos", "FAILED")) == 1
    capsys.readouterr()

    monkeypatch.delenv("FAKE_RUN_FAIL")
    assert main(sweep_args(ws, "inject_pos", "seeds=[0]")) == 0
    second = calls(ws)[6:]
    assert [c["name"] for c in second] == ["inject_pos:pre-attention"]
    out = capsys.readouterr().out
    assert out.count(" skipped ") == 5 and out.count(" ran ") == 1

    assert main(sweep_args(ws, "inject_pos", "seeds=[0]")) == 0
    assert len(calls(ws)) == 7  # nothing ran a third time
    finished = child_runs(ws, "inject_pos", "FINISHED")
    assert len(finished) == 6 and len({r.data.tags["ready.config_hash"] for r in finished}) == 6


def test_killed_sweep_finishes_the_rest_on_rerun(ws: Path, monkeypatch):
    env = dict(os.environ, FAKE_RUN_SLEEP="1.5")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", *sweep_args(ws, "inject_pos", "seeds=[0]"), "--workers", "1"], env=env, cwd=ws,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (len(calls(ws, "end")) >= 2 and len(calls(ws)) >= 3):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {c["hash"] for c in calls(ws, "end")}
    interrupted = {c["hash"] for c in calls(ws)} - done_before
    assert len(done_before) >= 2 and len(interrupted) == 1
    n_before = len(calls(ws))

    assert main(sweep_args(ws, "inject_pos", "seeds=[0]")) == 0
    rerun = {c["hash"] for c in calls(ws)[n_before:]}
    assert interrupted <= rerun and not (rerun & done_before)
    finished = child_runs(ws, "inject_pos", "FINISHED")
    assert len(finished) == 6 and len({r.data.tags["ready.config_hash"] for r in finished}) == 6
    statuses = Counter(r.info.status for r in child_runs(ws, "inject_pos"))
    assert statuses["RUNNING"] == 0 and statuses["KILLED"] >= 1  # the run it was in is marked, not left running


def _two_workers(ws: Path, monkeypatch, storage: list[str]) -> None:
    monkeypatch.setenv("FAKE_RUN_BARRIER", "2")
    monkeypatch.setenv("FAKE_RUN_SLEEP", "0.2")
    assert main(sweep_args(ws, "inject_pos", "seeds=[0,1]", "--workers", "2", *storage)) == 0
    starts = calls(ws)
    sweep = load_sweep("inject_pos", ["seeds=[0,1]"])
    assert Counter(c["hash"] for c in starts) == Counter({j.config_hash: 1 for j in sweep.jobs()})
    assert len({c["pid"] for c in starts}) == 2 and os.getpid() not in {c["pid"] for c in starts}
    finished = child_runs(ws, "inject_pos", "FINISHED")
    assert len(finished) == len(sweep.jobs()) == 1 + 2 * 5
    assert len({r.data.tags["ready.config_hash"] for r in finished}) == len(finished)


def test_two_worker_processes_never_run_the_same_row_journal_file(ws: Path, monkeypatch):
    _two_workers(ws, monkeypatch, [])
    assert (ws / "runs" / "inject_pos" / "optuna.journal").is_file()


@pytest.fixture
def postgres_url():
    """A throw-away PostgreSQL database, its URL in the form the docs write (`postgresql://...`)."""
    with postgres_server(("optuna",)) as urls:
        yield urls["optuna"]


def test_two_worker_processes_never_run_the_same_row_postgresql(ws: Path, monkeypatch, postgres_url: str):
    _two_workers(ws, monkeypatch, ["--storage", postgres_url])
    assert not (ws / "runs" / "inject_pos" / "optuna.journal").exists()


def test_a_worker_yields_a_row_claimed_earlier_by_another():
    sweep = load_sweep("inject_pos")
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    job = sweep.jobs()[-1]
    for _ in range(2):  # two coordinators enqueued the same row
        study.enqueue_trial({}, user_attrs=st.job_attrs(job, sweep))
    first, second = st.claim(study), st.claim(study)
    assert first.number != second.number and st.claim(study) is None
    assert st.earlier_claim(study, second) == first.number
    assert st.earlier_claim(study, first) is None


def test_workers_keep_to_one_seed_and_spread_over_the_seeds():
    """A worker takes its own seed's rows first, then a seed nobody runs, then the rest: rows of a
    seed share the worker's memo of target passes."""
    sweep = load_sweep("rank")
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    for job in sweep.jobs():
        study.enqueue_trial({}, user_attrs=st.job_attrs(job, sweep))
    assert [st.first_seed(study, i) for i in range(4)] == [0, 1, 2, 0]
    a = st.claim(study, st.first_seed(study, 0))
    b = st.claim(study, st.first_seed(study, 1))
    assert (a.user_attrs["seed"], b.user_attrs["seed"]) == (0, 1)
    assert a.number < b.number and b.number == min(
        t.number for t in study.trials if t.user_attrs["seed"] == 1)  # the lowest row of seed 1
    assert st.claim(study, 0).user_attrs["seed"] == 0
    # a worker with no seed of its own joins neither running seed while seed 2 waits
    assert st.claim(study, None).user_attrs["seed"] == 2
    # once every seed runs somewhere, the lowest row of any seed
    lowest = min(t.number for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,)))
    assert st.claim(study, None).number == lowest


def test_search_sweep_runs_tpe_trials_from_the_paper_values(ws: Path):
    assert main(sweep_args(ws, "search_loss", "search.n_trials=3")) == 0
    runs = child_runs(ws, "search_loss", "FINISHED")
    assert sorted(r.data.tags["ready.method"] for r in runs) == ["ar", "dspark", "ready", "ready", "ready"]
    trials = sorted((r for r in runs if r.data.tags["ready.method"] == "ready"), key=lambda r: int(r.data.tags["ready.order"]))
    assert float(trials[0].data.params["train.loss.l1_weight"]) == 0.1
    assert float(trials[0].data.params["train.loss.decay_gamma"]) == 4.0
    assert len({r.data.params["train.loss.l1_weight"] for r in trials}) == 3
    n = len(calls(ws))
    assert main(sweep_args(ws, "search_loss", "search.n_trials=3")) == 0
    assert len(calls(ws)) == n  # the budget is spent; nothing runs again


def _logged_run(c, exp_id: str, setting: str, method: str, seed: int, evaluation: dict, tau: float) -> str:
    """A finished child run with its evaluation.json artifact, as `execute` leaves it."""
    from mlflow.entities import Metric

    tags = {"ready.kind": "variant", "ready.setting": setting, "ready.method": method, "ready.seed": str(seed),
            "ready.label": f"{method} s{seed}"}
    run = c.create_run(exp_id, tags=tags)
    c.log_batch(run.info.run_id, metrics=[Metric("overall/tau", tau, 0, 0), Metric("overall/tps", 100.0, 0, 0)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "evaluation.json")
        path.write_text(json.dumps(evaluation))
        c.log_artifact(run.info.run_id, str(path))
    c.set_terminated(run.info.run_id)
    return run.info.run_id


def test_relative_metrics_pair_each_drafting_run_with_the_references_of_its_seed(ws: Path):
    from evaluation_logs import bench_rounds, evaluation
    from reports import stats

    c = tracking.client(f"sqlite:///{ws / 'mlflow.db'}")
    exp = tracking.ensure_experiment(c, "paired")
    evals, ids = {}, {}
    for seed in (0, 1):  # 32 prompts: enough differing units (reports.stats.MIN_DISCORDANT) for an interval
        ds = {"humaneval": bench_rounds(10 + seed, 32, 20)}
        rows = {"dspark": ds,
                "ft": {"humaneval": bench_rounds(20 + seed, 32, 20, 0.02, ds["humaneval"])},
                "placebo": {"humaneval": bench_rounds(30 + seed, 32, 20, 0.01, ds["humaneval"])},
                "ready": {"humaneval": bench_rounds(40 + seed, 32, 20, 0.10 + 0.05 * seed, ds["humaneval"])},
                "dflash": {"humaneval": bench_rounds(50 + seed, 32, 20, -0.05, ds["humaneval"])}}
        for method, r in rows.items():
            evals[method, seed] = evaluation(method, r)
            tau = stats.tau([stats.tallies(evals[method, seed])], "overall").value
            ids[method, seed] = _logged_run(c, exp, "S", method, seed, evals[method, seed], tau)
    assert tracking.log_relative_metrics(c, exp, "S") == 10

    ready1 = c.get_run(ids["ready", 1]).data.metrics
    for name, ref in (("", "dspark"), ("ft", "ft"), ("placebo", "placebo")):
        want = stats.relative_metrics(evals["ready", 1], evals[ref, 1], name)  # seed 1 against seed 1
        assert want and {k: ready1[k] for k in want} == pytest.approx(want)
    assert ready1["overall/tau_gain_pct"] == pytest.approx(15.0, abs=0.1)  # not seed 0's +10 %
    dflash0 = c.get_run(ids["dflash", 0]).data.metrics  # DFlash, too, is paired against DSpark of its seed
    want = stats.relative_metrics(evals["dflash", 0], evals["dspark", 0], "")
    assert want and {k: dflash0[k] for k in want} == pytest.approx(want)
    ft0 = c.get_run(ids["ft", 0]).data.metrics
    assert "overall/tau_gain_pct_lo" in ft0 and "overall/tau_gain_vs_ft_pct" not in ft0  # never against itself
    assert not any(k.endswith("_lo") for k in c.get_run(ids["dspark", 0]).data.metrics)  # the reference itself
    assert tracking.log_relative_metrics(c, exp, "S") == 0  # idempotent: same data, same interval
