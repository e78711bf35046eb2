"""Shared pieces of the fault tests (tests/test_artifacts_verified.py, tests/test_store_faults.py, ...).

Both files need a smoke artifacts cache and an MLflow store; each is built once per pytest
session under the session's base temp folder (whichever test asks first builds it), so the two
files share them without a conftest fixture. The store is created by several processes at
once: that is the concurrency fault, and its outcome is kept for the test that checks it.
This file holds no tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
SWEEP = "inject_pos"  # the smallest ablation sweep: AR, DSpark, FT, placebo, pre, post
RACERS = 2  # two invocations at once broke a new mlflow.db before the lock


@dataclass
class Smoke:
    cfg: Any  # the resolved config of one ReaDy row of `SWEEP profile=smoke`, artifacts under `artifacts`
    artifacts: Path
    regen: Path  # the training data's folder (regen/ also holds the validation split's)


def smoke_cache(base: Path) -> Smoke:
    """Tokenizer, pretrained target, AR generations, regenerated data, base drafter and both
    stages of one ReaDy row of the smoke profile, built once per session into `base/smoke`."""
    from sweeps.row import prepare_shared
    from ready.train import train_variant
    from ready.train.regen import build_regen_data
    from sweeps.spec import load_sweep

    artifacts = base / "smoke" / "artifacts"
    cfg = load_sweep(SWEEP, ["profile=smoke"]).variants[0].job(0).cfg
    cfg.artifacts_dir = str(artifacts)
    marker = base / "smoke" / "regen-folder"
    if not marker.exists():
        prepare_shared(cfg, ["ar", "ready"], progress=False)
        target, tokenizer = load(cfg)
        train_variant(cfg, target, tokenizer, None, artifacts / "stages", progress=False)
        marker.write_text(str(build_regen_data(cfg, target, tokenizer, progress=False)[1]))
    return Smoke(cfg=cfg, artifacts=artifacts, regen=Path(marker.read_text()))


def load(cfg: Any) -> tuple[Any, Any]:
    """(target, tokenizer) of a smoke config, as the pipeline loads them."""
    from ready.loading import load_configured_target

    loaded = load_configured_target(cfg, progress=False)
    return loaded.target, loaded.tokenizer


def raced_store(base: Path) -> tuple[Path, list[tuple[int, str]]]:
    """A new mlflow.db created by RACERS processes started at the same moment (each opens the
    store and creates an experiment). Returns the file and each process's (exit code, stderr tail)."""
    folder = base / "raced-store"
    db = folder / "mlflow.db"
    record = folder / "outcomes.json"
    if not record.exists():
        folder.mkdir(parents=True, exist_ok=True)
        code = ("import sys, time; from sweeps import tracking; t = float(sys.argv[2]); "
                "time.sleep(max(0.0, t - time.time())); "
                "c = tracking.client(sys.argv[1]); print(tracking.ensure_experiment(c, 'race-' + sys.argv[3]))")
        start = time.time() + 8.0  # after every interpreter has imported mlflow
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, "-c", code, f"sqlite:///{db}", str(start), str(i)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(RACERS)]
        outcomes = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            outcomes.append((p.returncode, err.strip()[-2000:]))
        record.write_text(json.dumps(outcomes))
    return db, [tuple(x) for x in json.loads(record.read_text())]


def store_copy(base: Path, dest: Path) -> str:
    """A private copy of the raced store (MLflow's schema is slow to create) as a tracking URI."""
    db, _ = raced_store(base)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(db, dest / "mlflow.db")
    return f"sqlite:///{dest / 'mlflow.db'}"


def errors(err: str) -> list[str]:
    """The `error:` lines of a command's stderr; a traceback anywhere fails the caller's check."""
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def sweep_args(uri: str, tmp_path: Path, *extra: str, runner: str = "fault_helpers:nan_run_variant") -> list[str]:
    """`sweeps.run` arguments for SWEEP on the smoke profile with a fake runner, its own store and run folder."""
    return [SWEEP, "profile=smoke", *extra, "--runner", runner, "--tracking-uri", uri,
            "--run-dir", str(tmp_path / "run"), "--no-report", "--quiet", "--workers", "1"]


def fake_runner_env(log: Path, sleep: float) -> dict[str, str]:
    """Environment of a sweep subprocess whose rows run tests/test_sweeps_fake_runner (logging to `log`,
    each row taking `sleep` seconds)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1",
            "FAKE_RUN_LOG": str(log), "FAKE_RUN_SLEEP": str(sleep)}


def wait_for_a_started_row(proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Block until the fake runner logged a started row (or the sweep ended / timed out); assert it did."""
    deadline = time.time() + timeout
    while '"start"' not in log.read_text() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert '"start"' in log.read_text(), "the sweep never started a row"


def nan_run_variant(cfg: Any, method: str = "ready", progress: bool = True):
    """A runner (--runner fault_helpers:nan_run_variant) whose drafting rows come back with NaN τ,
    as a broken model's would: the run must end FAILED, never FINISHED."""
    from ready.metrics import SequenceLog, overall, summarize
    from sweeps.row import VariantResult

    k = 0 if method == "ar" else int(cfg.drafter.proposals)
    per = []
    for suite in cfg.bench.suites:
        m = summarize([SequenceLog(new_tokens=8, wall_s=0.5, accepted=[0] * 8, horizons=[k] * 8)], str(suite), method, k)
        m.lossless = 1
        if method != "ar":
            m.tau = float("nan")
        per.append(m)
    return VariantResult(method=method, benchmarks=per, overall=overall(per), evaluation={"fake": True})


def full_disk_run_variant(cfg: Any, method: str = "ready", progress: bool = True):
    """A runner (--runner fault_helpers:full_disk_run_variant) that writes under artifacts_dir, as every
    row does, where `<artifacts_dir>/full` leads to /dev/full: the write fails with ENOSPC."""
    with open(Path(cfg.artifacts_dir) / "full", "wb") as f:
        f.write(b"\0" * (1 << 16))
    raise AssertionError("the write to /dev/full succeeded")


@contextlib.contextmanager
def postgres_server(databases: tuple[str, ...] = ("optuna",)) -> Iterator[dict[str, str]]:
    """A throw-away PostgreSQL server on a unix socket in a temporary folder (`initdb` from PATH or
    /usr/lib/postgresql/*/bin; .ci/run installs it), with one database per name; yields name -> URL in the
    form the docs write (`postgresql://USER@/DB?host=...&port=...`, no driver named). With
    $READY_TEST_POSTGRES_URL (a server of one's own, `postgresql://user@host:5432`), its databases of
    these names are used (make them empty first). pytest.skip when neither can be had."""
    import pytest

    base = os.environ.get("READY_TEST_POSTGRES_URL")
    if base:
        yield {name: base.rstrip("/") + "/" + name for name in databases}
        return
    initdb = shutil.which("initdb") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))), None)
    if initdb is None:
        pytest.skip("no PostgreSQL server binaries (initdb) here; set READY_TEST_POSTGRES_URL to use one")
    tmp = Path(tempfile.mkdtemp(prefix="ready-pg-"))
    bindir = Path(initdb).resolve().parent  # beside the server's own binaries (createdb, pg_ctl)
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    data, port = tmp / "data", 54000 + os.getpid() % 1000
    stop = [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]
    try:
        if os.geteuid() == 0:
            shutil.chown(tmp, "postgres")
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                       check=True, capture_output=True)
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(tmp / "log"), "-o",
                        f"-k {tmp} -p {port} -c listen_addresses=''", "start"], check=True, capture_output=True)
        for name in databases:
            subprocess.run([*as_user, str(bindir / "createdb"), "-h", str(tmp), "-p", str(port), "-U", "postgres", name],
                           check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError, LookupError) as e:
        subprocess.run(stop, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"cannot start a PostgreSQL server here: {e}")
    try:
        yield {name: f"postgresql://postgres@/{name}?host={tmp}&port={port}" for name in databases}
    finally:
        subprocess.run(stop, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

