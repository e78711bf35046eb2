"""Every bad input and fault ends in one line and leaves the store healthy (issue 15): a new
mlflow.db created by several invocations at once, an unreachable tracking server, a SIGKILLed
sweep's parent run, a file that is not an MLflow store, broken or ambiguous specs, bad options,
and a run whose numbers cannot be real (NaN τ) — FAILED, never FINISHED."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fault_helpers import SWEEP, errors, fake_runner_env, raced_store, store_copy, sweep_args, wait_for_a_started_row
from reports.build import main as reports_main
from reports.mlflow_store import PROBE_TIMEOUT_S
from sweeps import tracking
from sweeps.run import main
from sweeps.spec import EXPERIMENTS_DIR, SpecError, load_sweep



@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


def children(uri: str, sweep: str = SWEEP) -> list:
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(f"ready-{sweep}")
    return list(c.search_runs([exp.experiment_id], filter_string="tags.`ready.kind` = 'variant'")) if exp else []


# ---------------------------------------------------------------------------------------------
# The tracking store


def test_a_new_store_created_by_several_invocations_at_once_works_for_all(base: Path) -> None:
    db, outcomes = raced_store(base)
    assert [code for code, _ in outcomes] == [0] * len(outcomes), outcomes
    names = {e.name for e in tracking.client(f"sqlite:///{db}").search_experiments()}
    assert {tracking.experiment_name(f"race-{i}") for i in range(len(outcomes))} <= names


def test_a_file_that_is_not_an_mlflow_store_is_one_line_for_sweeps_and_reports(tmp_path: Path, capsys) -> None:
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"these are not the tables you are looking for\n" * 200)
    before = db.read_bytes()
    assert main(sweep_args(f"sqlite:///{db}", tmp_path)) == 2
    (line,) = errors(capsys.readouterr().err)
    assert f"{db} is not a usable MLflow store (" in line and "file is not a database" in line
    assert reports_main(["--tracking-uri", f"sqlite:///{db}", "--out", str(tmp_path / "out")]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert "not a readable MLflow store (" in line
    assert db.read_bytes() == before  # left as it was


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_tracking_server_is_one_line_before_mlflow_retries(tmp_path: Path, capsys, monkeypatch) -> None:
    """MLflow's own client retries an unreachable server for minutes without a word: the store is probed
    first, once, with a short timeout, and MLflow's REST client is never reached."""
    import urllib.request

    import mlflow.utils.rest_utils as rest_utils

    mlflow_requests, probes = [], []
    monkeypatch.setattr(rest_utils, "http_request", lambda *a, **k: mlflow_requests.append(k) or pytest.fail("MLflow"))
    real_urlopen = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, *a, **k: probes.append((url, k.get("timeout")))
                        or real_urlopen(url, *a, **k))
    uri = f"http://127.0.0.1:{_closed_port()}"
    assert main(sweep_args(uri, tmp_path)) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line == (f"error: tracking URI '{uri}': the connection was refused (Connection refused: nothing listens at "
                    "that address); expected a reachable MLflow server (`mlflow server ...`) or a sqlite:/// path")
    assert probes == [(f"{uri}/health", PROBE_TIMEOUT_S)] and mlflow_requests == []
    with socket.socket() as silent:  # accepts connections, never answers: the timeout
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        with pytest.raises(tracking.TrackingError, match=r"no answer within 0.5 s \(timed out\)"):
            tracking.check_server(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
    assert probes[-1][1] == 0.5 and mlflow_requests == []


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("handler, ok", [(_Health, True), (http.server.BaseHTTPRequestHandler, False)])
def test_only_a_server_that_answers_like_mlflow_counts_as_reachable(handler, ok: bool) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if ok:
            tracking.check_server(uri, timeout=5)
        else:  # e.g. a gateway in front of nothing: HTTP 501 / 404 / 502
            with pytest.raises(tracking.TrackingError, match=r"answers HTTP 501 to MLflow's API"):
                tracking.check_server(uri, timeout=5)
    finally:
        server.shutdown()


def test_a_parent_run_is_reaped_only_when_its_process_on_this_host_is_gone(base: Path, tmp_path: Path) -> None:
    c = tracking.client(store_copy(base, tmp_path))
    exp = tracking.ensure_experiment(c, "reap")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()

    def parent(h: str, pid: int) -> str:
        return c.create_run(exp, tags={"ready.kind": "sweep", "ready.host": h, "ready.pid": str(pid)}).info.run_id

    dead, alive, elsewhere = parent(host, int(gone.stdout)), parent(host, os.getpid()), parent("other-host", 1)
    legacy = c.create_run(exp, tags={"ready.kind": "sweep"}).info.run_id
    assert tracking.reap_parents(c, exp) == 1
    status = {r: c.get_run(r).info.status for r in (dead, alive, elsewhere, legacy)}
    assert status == {dead: "KILLED", alive: "RUNNING", elsewhere: "RUNNING", legacy: "RUNNING"}


def test_a_sigkilled_sweep_leaves_nothing_running_after_the_next_invocation(base: Path, tmp_path: Path,
                                                                          capsys) -> None:
    uri = store_copy(base, tmp_path / "store")
    log = tmp_path / "calls.jsonl"
    log.touch()
    env = fake_runner_env(log, 300)
    cmd = [sys.executable, "-m", "sweeps.run", *sweep_args(uri, tmp_path, runner="test_sweeps_fake_runner")]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_a_started_row(proc, log)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    c = tracking.client(uri)
    exp = c.get_experiment_by_name(f"ready-{SWEEP}").experiment_id
    (killed,) = c.search_runs([exp], filter_string="tags.`ready.kind` = 'sweep'")
    assert killed.info.status == "RUNNING" and killed.data.tags["ready.pid"] == str(proc.pid)

    capsys.readouterr()
    assert main(sweep_args(uri, tmp_path, runner="test_sweeps_fake_runner")) == 0
    assert "marked 1 sweep run(s) KILLED" in capsys.readouterr().out
    assert c.get_run(killed.info.run_id).info.status == "KILLED"
    runs = c.search_runs([exp], filter_string="attributes.status = 'RUNNING'")
    assert runs == []  # the killed row's child was reaped with its trial, the new parent finished


# ---------------------------------------------------------------------------------------------
# A run whose numbers cannot be real


def test_nan_tau_ends_the_run_failed_with_the_reason_never_finished(base: Path, tmp_path: Path, capsys) -> None:
    uri = store_copy(base, tmp_path / "store")
    assert main(sweep_args(uri, tmp_path)) == 1
    err = capsys.readouterr().err
    runs = children(uri)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    failed = [r for r in runs if r.info.status == "FAILED"]
    assert [r.data.tags["ready.method"] for r in finished] == ["ar"]  # the only row with real numbers
    assert len(failed) == len(runs) - 1 == 5
    for r in failed:
        assert "HealthError" in r.data.tags["ready.error"] and "is nan" in r.data.tags["ready.error"]
        assert "overall/tau" not in r.data.metrics
    lines = [ln for ln in err.splitlines() if ln.startswith("[sweeps] FAILED")]
    assert len(lines) == 5 and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Specs and options


@pytest.fixture
def experiments(tmp_path: Path) -> Path:
    """A copy of experiments/ that a test may break."""
    return Path(shutil.copytree(EXPERIMENTS_DIR, tmp_path / "experiments"))


def test_a_broken_spec_file_is_that_files_problem_only(experiments: Path, capsys) -> None:
    (experiments / "broken.yaml").write_text("table: table3\ngrid: {values: {reader.rank: [8, 16}\n")
    (experiments / "listy.yaml").write_text("- just\n- a list\n")
    assert main(["--list", "--experiments-dir", str(experiments)]) == 0
    out = capsys.readouterr().out
    assert "BROKEN broken.yaml: did not find expected ',' or ']' (line 2, column " in out
    assert "BROKEN listy.yaml: expected a mapping" in out
    assert "table3: reader rank" in out  # the other sweeps are listed as before
    assert main(["rank", "--dry-run", "--experiments-dir", str(experiments)]) == 0
    capsys.readouterr()
    assert main(["broken", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert f"{experiments / 'broken.yaml'}: not valid YAML: did not find expected ',' or ']' (line 2, column " in line


def test_two_rows_with_one_label_are_refused_naming_the_key(experiments: Path) -> None:
    (experiments / "dup.yaml").write_text(
        "table: table3\nvariants:\n  - {label: r8, set: {reader.rank: 8}}\n  - {label: r8, set: {reader.rank: 16}}\n")
    with pytest.raises(SpecError, match=r"dup.yaml: bad value at key 'variants\[1\].label': label 'r8' is already "
                                        r"used by 'variants\[0\].label'"):
        load_sweep("dup", experiments_dir=experiments)
    (experiments / "dupgrid.yaml").write_text(
        "table: table3\ngrid: {values: {reader.rank: [8, 16], reader.position: [pre, post]}, label: 'r={reader.rank}'}\n")
    with pytest.raises(SpecError, match=r"bad value at key 'grid.label': label 'r=8' is already used"):
        load_sweep("dupgrid", experiments_dir=experiments)


def test_empty_bench_suites_is_refused_at_resolve_time(capsys) -> None:
    with pytest.raises(SpecError, match=r"bad value at key 'bench.suites': \[\]; expected a non-empty list"):
        load_sweep("rank", ["bench.suites=[]"])
    assert main(["rank", "bench.suites=[]", "--dry-run"]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert "'bench.suites'" in line


@pytest.mark.parametrize("key", ["threads.shared", "threads.drafters"])
def test_threads_below_one_is_refused(key: str, capsys) -> None:
    assert main(["rank", f"{key}=0", "--dry-run"]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert f"bad value at key '{key}': 0; expected an integer >= 1" in line


def test_the_threads_option_points_to_the_config_keys_that_replace_it(capsys) -> None:
    assert main(["rank", "--threads", "2", "--dry-run"]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: --threads 2:") and "threads.shared=K" in line and "threads.drafters=K" in line
