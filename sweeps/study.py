"""Optuna underneath a sweep: a queue of (variant, seed) jobs that any number of workers drain.

One study per sweep setting (`<sweep>-<setting hash>`). Declared rows are enqueued as WAITING
trials (a grid); a worker claims one with the storage's atomic WAITING -> RUNNING transition,
so two workers never get the same trial. Search sweeps add a second study
(`<sweep>-<setting>-search`) sampled by TPE.

Storage: by default an Optuna journal file, `runs/<sweep>/optuna.journal` (`Journal`, Optuna's
`JournalFileBackend`: appends under a file lock, safe for several processes on one host, no server;
a record torn by a crash in the middle of an append is cut off by the next append, never glued to);
`--storage postgresql://user@host/db` (any SQLAlchemy URL) for workers on several hosts.

Re-runs: MLflow is the record of finished work. Before enqueueing, a job whose config hash has a
FINISHED child run is skipped; failed or interrupted ones are enqueued again. A worker that
claims a job checks again (another host may have finished it meanwhile) and yields when an
earlier-claimed trial of the same job is still running. Workers write a heartbeat into their
trial; a RUNNING trial whose worker died (same host: its pid is gone; any host: no heartbeat
for `STALE_AFTER_S`) is marked FAIL and its MLflow run KILLED, so it is run again.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import optuna
from omegaconf import OmegaConf
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState

from ready.config import load_config
from ready.health import check_metrics
from reports.mlflow_store import database_problem, database_url, redact
from sweeps import tracking
from sweeps.liveness import STALE_AFTER_S, pid_alive, process_start
from sweeps.spec import Job, Sweep, Variant, search_config

HEARTBEAT_S = 30.0
DEFAULT_RUNNER = "sweeps.row"

optuna.logging.set_verbosity(optuna.logging.WARNING)


class StudyError(ValueError):
    """A storage URL or study state the runner cannot use; the message says what was expected."""


class Claimed(Exception):
    """The job is held by another run in the tracking store (finished, or running under a live worker
    of another invocation): this worker leaves it. Not a failure."""


# faults of the machine rather than of the code: a full disk, a read-only or forbidden path
MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def machine_fault(e: BaseException) -> Optional[str]:
    """One line for an OSError the machine caused (MACHINE_ERRNOS), naming the path; None for any
    other error, whose traceback is worth showing."""
    if not isinstance(e, OSError) or e.errno not in MACHINE_ERRNOS:
        return None
    return f"{e.filename}: {e.strerror}" if e.filename else f"{e.strerror or e}"


def check_run_dir(run_dir: Path) -> None:
    """The run folder must be a folder this process can write: the Optuna journal and the workers'
    logs go there."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir):
            pass
    except OSError as e:
        raise StudyError(f"--run-dir {run_dir}: cannot write in it ({e.strerror or e}); expected a writable "
                         "folder for the Optuna journal and the workers' logs") from None


# ---------------------------------------------------------------------------------------------
# Storage and studies


class Journal(JournalFileBackend):
    """Optuna's journal file (one JSON record per line, appended under a file lock), made safe against a
    crash in the middle of an append. Optuna reads a last line without its newline as not yet written, but
    the next append would glue its record onto those bytes and every later read would fail on that line;
    here an append first cuts such a torn tail off (under the same lock, with one line on stderr: the
    record was never complete, so its writer never went on from it). A damaged line elsewhere (an edit, a
    disk fault) is one StudyError naming the file, the line and what to do, not a bare JSON error."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = JournalFileSymlinkLock(str(self.path))  # Optuna's default lock (works on NFS too)
        super().__init__(str(self.path), lock_obj=self.lock)

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        try:
            yield from super().read_logs(log_number_from)
        except ValueError:  # json.JSONDecodeError, or Optuna's "Invalid log format." for a glued line
            raise StudyError(damaged_journal(self.path)) from None

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
        self.lock.acquire()
        try:
            with open(self.path, "a+b") as f:  # appends land at the end whatever the position
                torn = drop_torn_tail(f)
                if torn:
                    print(f"[sweeps] {self.path}: dropped a torn last record ({torn} bytes without their line end: "
                          "a crash while it was written)", file=sys.stderr, flush=True)
                f.seek(0, os.SEEK_END)
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        finally:
            self.lock.release()


def drop_torn_tail(f: Any) -> int:
    """Cut an open binary file back to its last line end; the number of bytes cut (0: it ends in one)."""
    size = f.seek(0, os.SEEK_END)
    if size == 0:
        return 0
    f.seek(size - 1)
    if f.read(1) == b"\n":
        return 0
    end = size
    while end > 0:  # back to the last newline, a block at a time
        start = max(0, end - 65536)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            keep = start + at + 1
            break
        end = start
    else:
        keep = 0
    f.truncate(keep)
    return size - keep


def damaged_journal(path: Path) -> str:
    """The one line for a journal that does not read: which line, and what to do."""
    line_no = 0
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            try:
                json.loads(line)
            except ValueError:
                break
    return (f"Optuna journal {path}: line {line_no} is not a complete record (a crash while it was written, or an edit); "
            "expected one JSON record per line: move the file aside (the queue is rebuilt on the next run, and rows "
            "MLflow holds as finished are skipped)")


def open_storage(url: Optional[str], run_dir: Path):
    """`None` -> journal file under `run_dir` (`Journal`); a URL with `://` -> an RDB storage (PostgreSQL, ...),
    in the form the docs write it (`postgresql://...`: `reports.mlflow_store.database_url` names the driver),
    checked with one connection first so an unreachable server is one line within seconds."""
    if not url:
        from optuna.storages import JournalStorage

        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / "optuna.journal"
        if path.exists() and not path.is_file():
            raise StudyError(f"Optuna journal {path}: is a folder; expected the run folder's journal file (move the "
                             "folder aside, or pass another --run-dir)")
        return JournalStorage(Journal(path))
    if "://" not in url:
        raise StudyError(f"--storage {url!r}: expected a database URL such as postgresql://user@host:5432/optuna")
    problem = database_problem(url)
    if problem is not None:
        raise StudyError(f"--storage {redact(url)!r}: {problem}; expected a reachable database URL such as "
                         "postgresql://user@host:5432/optuna")
    try:
        return optuna.storages.RDBStorage(database_url(url), engine_kwargs={"pool_pre_ping": True})
    except Exception as e:
        raise StudyError(f"--storage {redact(url)!r}: cannot open it ({str(e).splitlines()[0]}); "
                         "expected a reachable database URL such as postgresql://user@host:5432/optuna") from None


def describe_storage(url: Optional[str], run_dir: Path) -> str:
    if not url:
        return f"journal:{run_dir / 'optuna.journal'}"
    return url.split("@")[-1] if "@" in url else url  # never log a password


def grid_study_name(sweep: Sweep) -> str:
    return f"{sweep.name}-{sweep.setting}"


def open_grid_study(storage, sweep: Sweep) -> optuna.Study:
    study = optuna.create_study(study_name=grid_study_name(sweep), storage=storage, load_if_exists=True,
                                direction="maximize")
    study.set_user_attr("sweep", sweep.name)
    study.set_user_attr("table", sweep.table)
    return study


def open_search_study(storage, sweep: Sweep) -> optuna.Study:
    search = sweep.spec.search
    sampler = optuna.samplers.TPESampler(seed=int(search.sampler_seed))
    return optuna.create_study(study_name=f"{grid_study_name(sweep)}-search", storage=storage,
                               load_if_exists=True, direction=str(search.direction), sampler=sampler)


# ---------------------------------------------------------------------------------------------
# Job <-> trial


def job_attrs(job: Job, sweep: Sweep) -> dict[str, Any]:
    """Everything a worker (on any host) needs to run the job, stored on the trial."""
    return {
        "job": job.config_hash, "variant_id": job.variant.variant_id, "label": job.variant.label,
        "order": job.variant.order, "method": job.variant.method, "seed": job.seed,
        "sweep": sweep.name, "table": sweep.table, "setting": sweep.setting,
        "swept": {k: v for k, v in job.variant.swept.items()},
        "config": OmegaConf.to_container(job.cfg, resolve=True),
    }


def job_from_attrs(attrs: dict[str, Any]) -> Job:
    """The job a trial stores (`job_attrs`): its resolved config read back through the one loader."""
    cfg = load_config(files=[(f"the stored config of job {attrs['job']}", attrs["config"])])
    variant = Variant(label=attrs["label"], order=int(attrs["order"]), method=attrs["method"], cfg=cfg,
                      variant_id=attrs["variant_id"], swept=dict(attrs.get("swept") or {}))
    return Job(variant=variant, seed=int(attrs["seed"]), cfg=cfg, config_hash=attrs["job"])


def is_stale(trial: optuna.trial.FrozenTrial, now: Optional[float] = None) -> bool:
    """A RUNNING trial whose worker is gone: dead pid on this host, or no heartbeat for a while."""
    if trial.state != TrialState.RUNNING:
        return False
    ua = trial.user_attrs
    now = time.time() if now is None else now
    if ua.get("worker_host") == socket.gethostname() and "worker_pid" in ua:
        if not pid_alive(int(ua["worker_pid"]), ua.get("worker_started")):
            return True
    beat = ua.get("heartbeat")
    if beat is None and trial.datetime_start is not None:
        beat = trial.datetime_start.timestamp()
    return beat is not None and now - float(beat) > STALE_AFTER_S


def reap_stale(study: optuna.Study, c=None) -> int:
    """Mark trials of dead workers FAIL (and their MLflow runs KILLED); returns how many."""
    storage = study._storage  # noqa: SLF001  (the public Study API has no per-trial state setter)
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_stale(t):
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, "failure", "interrupted: worker gone")  # noqa: SLF001
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001
        except Exception:
            continue  # finished meanwhile
        if c is not None and t.user_attrs.get("mlflow_run_id"):
            tracking.kill_run(c, t.user_attrs["mlflow_run_id"])
        n += 1
    return n


@dataclass
class PlanRow:
    job: Job
    status: str  # finished | queued | waiting | running
    run_id: Optional[str] = None


def plan(study: optuna.Study, sweep: Sweep, c, experiment_id: str) -> list[PlanRow]:
    """Enqueue every job of the sweep that has no finished MLflow run and is not queued already."""
    reap_stale(study, c)
    live = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        if "job" in t.user_attrs:
            live[t.user_attrs["job"]] = "waiting" if t.state == TrialState.WAITING else "running"
    held = tracking.live_claims(c, experiment_id, sweep.setting)  # by any invocation, whatever its run folder
    rows = []
    for job in sweep.jobs():
        run = held.get(job.config_hash)
        if run is not None and run.info.status == "FINISHED":
            rows.append(PlanRow(job, "finished", run.info.run_id))
        elif job.config_hash in live:
            rows.append(PlanRow(job, live[job.config_hash]))
        elif run is not None:  # running under a live worker of another invocation
            rows.append(PlanRow(job, "running", run.info.run_id))
        else:
            study.enqueue_trial({}, user_attrs=job_attrs(job, sweep))
            rows.append(PlanRow(job, "queued"))
    return rows


def claim_order(waiting: list, running_seeds: set, prefer_seed: Optional[int] = None) -> list:
    """The order a worker tries WAITING trials in: its own seed's first (`prefer_seed`, the seed it
    ran last), then those of seeds no live worker is running, then the rest; lowest number first
    within each. Rows of one seed share their target passes and states through the worker's memo
    (ready.train.teacher_pass), so a worker that keeps to one seed computes them once instead of
    every worker computing every seed's. Which worker runs a row never changes its numbers."""
    def rank(t) -> int:
        seed = t.user_attrs.get("seed")
        if prefer_seed is not None and seed == prefer_seed:
            return 0
        return 1 if seed not in running_seeds else 2
    return sorted(waiting, key=lambda t: (rank(t), t.number))


def claim(study: optuna.Study, prefer_seed: Optional[int] = None) -> Optional[optuna.trial.FrozenTrial]:
    """Atomically move one WAITING trial to RUNNING for this worker, in `claim_order`."""
    storage = study._storage  # noqa: SLF001
    trials = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))  # one storage read
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    running = {t.user_attrs.get("seed") for t in trials if t.state == TrialState.RUNNING and not is_stale(t)}
    for t in claim_order(waiting, running, prefer_seed):
        try:
            if storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):  # noqa: SLF001
                return storage.get_trial(t._trial_id)  # noqa: SLF001
        except Exception:  # finished or claimed meanwhile
            continue
    return None


def earlier_claim(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Optional[int]:
    """Number of another live trial of the same job that was claimed before `trial`, if any."""
    job = trial.user_attrs.get("job")
    mine = (trial.datetime_start, trial.number)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number != trial.number and t.user_attrs.get("job") == job and not is_stale(t):
            if t.datetime_start is not None and (t.datetime_start, t.number) < mine:
                return t.number
    return None


class Heartbeat:
    """Writes `heartbeat` (epoch seconds) into a running trial every HEARTBEAT_S seconds, and into its
    MLflow run (tag `ready.heartbeat`) once `run` = (client, run id) is set."""

    def __init__(self, study: optuna.Study, trial_id: int, interval: float = HEARTBEAT_S):
        self.storage, self.trial_id, self.interval = study._storage, trial_id, interval  # noqa: SLF001
        self.run: Optional[tuple[Any, str]] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
            except Exception:
                return  # the trial finished (or was reaped): nothing left to keep alive
            if self.run is not None:
                try:
                    tracking.beat(*self.run)
                except Exception:
                    pass  # a busy store: the next beat tries again

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------------------------
# Worker


@dataclass
class WorkerContext:
    tracking_uri: str
    experiment_id: str
    parent_run_id: Optional[str]
    runner: str = DEFAULT_RUNNER
    progress: bool = True
    index: int = 0  # this worker's number among those started together (its first seed)
    ran: list[str] = field(default_factory=list)  # config hashes this worker executed
    failed: list[str] = field(default_factory=list)


def load_runner(path: str) -> Callable[..., Any]:
    """`module` (with `run_variant(cfg, method, progress=...)`) or `module:function`."""
    mod_name, _, fn_name = path.partition(":")
    module = importlib.import_module(mod_name)
    return getattr(module, fn_name or "run_variant")


def _objective(metrics: dict[str, float], name: str) -> float:
    return float(metrics.get(name, float("nan")))


def execute(job: Job, ctx: WorkerContext, c, sweep_name: str, table: str, setting: str,
            on_start: Callable[[str], None] = lambda run_id: None, objective: str = "overall/tau") -> float:
    """Run one job inside its MLflow child run; returns the objective. Raises on failure, and Claimed
    when the store says another run holds the job (checked and started under `tracking.claim_lock`, so
    two invocations with their own run folders, hence their own queues, never both run it)."""
    run_fn = load_runner(ctx.runner)
    with tracking.claim_lock(ctx.tracking_uri):
        held = tracking.live_claims(c, ctx.experiment_id, setting, job.config_hash).get(job.config_hash)
        if held is not None:
            t = held.data.tags
            raise Claimed(f"{'finished in' if held.info.status == 'FINISHED' else 'running in'} MLflow run "
                          f"{held.info.run_id} (host {t.get('ready.host')}, pid {t.get('ready.pid')})")
        child = tracking.ChildRun(ctx.tracking_uri, ctx.experiment_id, ctx.parent_run_id, job,
                                  tracking.child_tags(job, sweep_name, table, setting))
    on_start(child.run_id)
    try:
        params = tracking.flatten(job.cfg)
        child.log_params(params)
        t0 = time.time()
        result = run_fn(job.cfg, job.variant.method, progress=ctx.progress)
        metrics = result.metrics()
        check_metrics(metrics, job.variant.method, int(job.cfg.drafter.proposals))  # broken model: FAILED, not FINISHED
        metrics["time/run_s"] = time.time() - t0
        from reports.stats import run_metrics  # intervals from this run's per-prompt logs

        metrics.update(run_metrics(result.evaluation))
        resolved = result.resolved
        metrics.update(resolved.get("data_rows", {}))  # data/rows_read, data/rows_skipped, ... of data.path
        tags = {"ready.resolved_layers": str(resolved.get("state_layers", [])),
                "ready.resolved_context_layers": str(resolved.get("context_layers", [])),
                "ready.resolved_inject_layers": str(resolved.get("inject_layers", [])),
                "ready.lossless": str(int(result.lossless)),
                # 1: the trained drafter equals an earlier row's, whose evaluation record was reused
                "ready.evaluation_reused": str(int(bool(resolved.get("evaluation_reused", False))))}
        tags.update(result.tags() if hasattr(result, "tags") else {})  # ready.engine*, ready.target_reused (sweeps.row)
        if "rank" in resolved:
            tags["ready.resolved_rank"] = str(resolved["rank"])
            child.log_params({"reader.rank_resolved": str(resolved["rank"])})
        child.set_tags(tags)
        child.log_metrics(metrics)
        child.log_curves(result.curves)
        child.log_artifacts(job.cfg, result.evaluation, result.survival())
        run = c.get_run(child.run_id)
        tracking.log_relative_metrics(c, ctx.experiment_id, setting, runs=[run])
        child.close("FINISHED")
        if job.variant.method in ("ar", "dspark", "ft", "placebo"):  # rows that finished before a reference
            tracking.log_relative_metrics(c, ctx.experiment_id, setting)
        return _objective(metrics, objective)
    except BaseException as e:
        try:
            child.set_tags({"ready.error": f"{type(e).__name__}: {e}"[:4000]})
        except Exception:
            pass
        child.close("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise


def _run_trial(study: optuna.Study, trial_id: int, number: int, job: Job, ctx: WorkerContext, c,
               sweep_name: str, table: str, setting: str, objective: str) -> None:
    storage = study._storage  # noqa: SLF001
    for key, value in {"worker_host": socket.gethostname(), "worker_pid": os.getpid(),
                       "worker_started": process_start(), "heartbeat": time.time(),
                       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                       "parent_run_id": ctx.parent_run_id}.items():
        storage.set_trial_user_attr(trial_id, key, value)
    print(f"[sweeps] run  {job.variant.label} (seed {job.seed}, {job.variant.method}, {job.config_hash})", flush=True)

    def started(run_id: str, beat: Heartbeat) -> None:
        storage.set_trial_user_attr(trial_id, "mlflow_run_id", run_id)
        beat.run = (c, run_id)

    try:
        with Heartbeat(study, trial_id) as beat:
            value = execute(job, ctx, c, sweep_name, table, setting, on_start=lambda rid: started(rid, beat),
                            objective=objective)
    except KeyboardInterrupt:
        study.tell(number, state=TrialState.FAIL)
        raise
    except Claimed as e:  # another invocation's run holds it: left to that run, not a failure
        print(f"[sweeps] skip {job.variant.label} (seed {job.seed}): {e}", flush=True)
        storage.set_trial_user_attr(trial_id, "skipped", str(e))
        study.tell(number, state=TrialState.PRUNED)
        return
    except Exception as e:
        ctx.failed.append(job.config_hash)
        print(f"[sweeps] FAILED {job.variant.label} (seed {job.seed}): {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if not isinstance(e, ValueError) and machine_fault(e) is None:  # the user's or the machine's: one line
            traceback.print_exc()
        storage.set_trial_user_attr(trial_id, "failure", f"{type(e).__name__}: {e}"[:2000])
        study.tell(number, state=TrialState.FAIL)
        return
    ctx.ran.append(job.config_hash)
    if value == value:  # not NaN
        study.tell(number, value)
    else:  # finished without the objective metric: recorded, but not a point for the sampler
        study.tell(number, state=TrialState.FAIL)


def first_seed(study: optuna.Study, index: int) -> Optional[int]:
    """The seed worker `index` starts on: the index-th of the waiting seeds (workers started together
    would otherwise all see no seed running and take the first)."""
    seeds = sorted({t.user_attrs["seed"] for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                    if "seed" in t.user_attrs})
    return seeds[index % len(seeds)] if seeds else None


def drain_grid(study: optuna.Study, ctx: WorkerContext) -> None:
    """Claim and run WAITING trials until none is left, keeping to one seed while it has rows."""
    c = tracking.client(ctx.tracking_uri)
    seed = first_seed(study, ctx.index)
    while True:
        trial = claim(study, seed)
        if trial is None:
            return
        attrs = trial.user_attrs
        seed = attrs.get("seed")
        job = job_from_attrs(attrs)
        other = earlier_claim(study, trial)
        done = tracking.finished_run(c, ctx.experiment_id, job.config_hash, attrs["setting"]) if other is None else None
        if other is not None or done is not None:
            why = f"duplicate of trial {other}" if other is not None else f"finished in MLflow run {done.info.run_id}"
            study._storage.set_trial_user_attr(trial._trial_id, "skipped", why)  # noqa: SLF001
            study.tell(trial.number, state=TrialState.PRUNED)
            continue
        _run_trial(study, trial._trial_id, trial.number, job, ctx, c, attrs["sweep"], attrs["table"],  # noqa: SLF001
                   attrs["setting"], "overall/tau")


def search_budget_left(study: optuna.Study, n_trials: int) -> bool:
    counted = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING, TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=counted)) < n_trials


def drain_search(study: optuna.Study, sweep: Sweep, ctx: WorkerContext) -> None:
    """Ask TPE for trials until the study holds `search.n_trials` of them (shared by all workers)."""
    search = sweep.spec.search
    c = tracking.client(ctx.tracking_uri)
    reap_stale(study, c)
    while search_budget_left(study, int(search.n_trials)):
        trial = study.ask()
        params = {key: trial.suggest_float(key, float(r.low), float(r.high), log=bool(r.log))
                  for key, r in search.params.items()}
        label = ", ".join(f"{k.split('.')[-1]}={v:.4g}" for k, v in params.items())
        variant = search_config(sweep, params, label)
        variant.order = len(sweep.baselines) + trial.number
        job = variant.job(sweep.seeds[0])
        study._storage.set_trial_user_attr(trial._trial_id, "job", job.config_hash)  # noqa: SLF001
        done = tracking.finished_run(c, ctx.experiment_id, job.config_hash, sweep.setting)
        if done is not None:  # e.g. the paper's start point, run by an earlier invocation
            value = done.data.metrics.get(search.objective)
            if value is None:
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, value)
            continue
        _run_trial(study, trial._trial_id, trial.number, job, ctx, c, sweep.name, "search", sweep.setting,  # noqa: SLF001
                   str(search.objective))


def seed_search(storage, sweep: Sweep) -> None:
    """Enqueue the search's start point (e.g. the paper's values) once, before any worker asks."""
    search = sweep.spec.search
    study = open_search_study(storage, sweep)
    if search.start and not study.get_trials(deepcopy=False):
        study.enqueue_trial({k: float(v) for k, v in search.start.items()}, skip_if_exists=True)


def worker_main(sweep: Sweep, storage_url: Optional[str], run_dir: Path, ctx: WorkerContext) -> int:
    """One worker: drain the grid queue, then (search sweeps) the TPE study. Exit code 1 on failures."""
    storage = open_storage(storage_url, run_dir)
    drain_grid(open_grid_study(storage, sweep), ctx)
    if sweep.spec.search is not None and int(sweep.spec.search.n_trials) > 0:
        drain_search(open_search_study(storage, sweep), sweep, ctx)
    return 1 if ctx.failed else 0
