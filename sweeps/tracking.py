"""MLflow side of a sweep, following the contract in docs/interfaces.md ("MLflow").

Experiment `ready-<sweep>`; a parent run per invocation (tag `ready.kind=sweep`); a child run per
(variant, seed) and per baseline (tag `ready.kind=variant`) with flattened params, tags, metrics
(`<bench>/tau`, `<bench>/tps`, ... and `overall/...`, `train/<stage>/loss` curves) and artifacts
(resolved config YAML, evaluation JSON, survival plot PNG). Relative metrics (speedup vs AR,
gains vs DSpark) need the baselines of the same sweep setting, so they are (re)computed by
`log_relative_metrics` whenever the baselines are known.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import platform
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from ready.loading import inputs_identity
from ready.metrics import gain_pct, speedup
from reports.mlflow_store import (
    TrackingError, _file_lock, _sqlite_file, check_server, client, ensure_experiment as _ensure_experiment,
    experiment_name, flatten, prepare_store, resolve_tracking_uri, retry
)
from sweeps.liveness import STALE_AFTER_S, pid_alive, process_start

TABLES = {f"table{i}" for i in range(1, 7)}


def ensure_experiment(c, sweep: str, description: str = "") -> str:
    """The experiment id of `ready-<sweep>`, created on first use (safe when two processes race).

    Tagged as a model-training experiment with the sweep's description and the command that runs it
    as its note; an experiment made before these tags gets those it lacks (a note edited in the UI is kept)."""
    note = f"{description.strip()}\n\nRun: `python -m sweeps.run {sweep}`" if description.strip() else ""
    return _ensure_experiment(c, sweep, note)


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the code that runs (with `-dirty` when the work tree has changes)."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def made_from_tags(cfg: DictConfig) -> dict[str, str]:
    """What a run was made from beside its config, for the record: the inputs its setting hashes
    (`ready.loading.inputs_identity`), the interpreter and torch."""
    return {"ready.made_from": json.dumps(inputs_identity(cfg), sort_keys=True),
            "ready.python": platform.python_version(), "ready.torch": torch.__version__}


def start_parent(c, experiment_id: str, sweep, storage_desc: str, workers: int) -> str:
    """A parent run for this invocation; its children are the runs this invocation executes."""
    from mlflow.entities import Param

    tags = {
        "ready.kind": "sweep",
        "ready.sweep": sweep.name,
        "ready.table": sweep.table,
        "ready.setting": sweep.setting,
        "ready.model": str(sweep.common.target.source),
        "ready.profile": sweep.profile or "",
        "ready.preset": sweep.preset,
        "ready.git_commit": git_commit(),
        "ready.overrides": " ".join(sweep.overrides),
        "ready.storage": storage_desc,
        "ready.workers": str(workers),
        **made_from_tags(sweep.common),
        # who runs it: the next invocation marks this run KILLED when that process is gone (reap_parents)
        "ready.host": socket.gethostname(),
        "ready.pid": str(os.getpid()),
        "ready.pid_started": repr(process_start()),
    }
    run = retry(lambda: c.create_run(experiment_id, run_name=f"{sweep.name} sweep", tags=tags))
    params = [Param(k, v[:6000]) for k, v in flatten(sweep.common).items()]
    params.append(Param("sweep.seeds", json.dumps(sweep.seeds)))
    for i in range(0, len(params), 100):
        retry(lambda: c.log_batch(run.info.run_id, params=params[i:i + 100]))
    return run.info.run_id


def finished_run(c, experiment_id: str, config_hash: str, setting: str):
    """The latest FINISHED child run of sweep setting `setting` whose config hash is `config_hash`, or
    None. A row two settings share (AR, whose config has no drafter) runs once per setting: each
    setting's tables hold their own baselines."""
    runs = retry(lambda: c.search_runs(
        [experiment_id],
        filter_string=f"tags.`ready.config_hash` = '{config_hash}' and tags.`ready.setting` = '{setting}' "
                      "and attributes.status = 'FINISHED'",
        max_results=1, order_by=["attributes.start_time DESC"]))
    return runs[0] if runs else None


def setting_runs(c, experiment_id: str, setting: str, method: Optional[str] = None) -> list:
    """Every FINISHED child run of one sweep setting (optionally of one method), newest first."""
    filt = f"tags.`ready.setting` = '{setting}' and tags.`ready.kind` = 'variant' and attributes.status = 'FINISHED'"
    if method:
        filt += f" and tags.`ready.method` = '{method}'"
    return list(retry(lambda: c.search_runs([experiment_id], filter_string=filt, max_results=5000,
                                            order_by=["attributes.start_time DESC"])))


def child_tags(job, sweep_name: str, table: str, setting: str) -> dict[str, str]:
    """A child run's tags at its start, who runs it included (host, pid, heartbeat: `claim_alive`)."""
    cfg = job.cfg
    return {
        "ready.kind": "variant",
        "ready.sweep": sweep_name,
        "ready.table": table,
        "ready.setting": setting,
        "ready.method": job.variant.method,
        "ready.label": job.variant.label,
        "ready.order": str(job.variant.order),
        "ready.variant_id": job.variant.variant_id,
        "ready.config_hash": job.config_hash,
        "ready.model": str(cfg.target.source),
        "ready.seed": str(job.seed),
        **made_from_tags(cfg),
        "ready.git_commit": git_commit(),
        "ready.host": os.uname().nodename,
        "ready.cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "ready.pid": str(os.getpid()),
        "ready.pid_started": repr(process_start()),
        "ready.heartbeat": repr(time.time()),
    }


# ---------------------------------------------------------------------------------------------
# Claims: the store every invocation of a sweep shares says who runs a job, whatever its run folder


def claim_alive(run, now: Optional[float] = None) -> bool:
    """Whether the worker of a RUNNING child run still works on it: on this host, its process is
    there; elsewhere, its heartbeat (tag `ready.heartbeat`, else its start) is younger than STALE_AFTER_S."""
    tags = run.data.tags
    if tags.get("ready.host") == os.uname().nodename and tags.get("ready.pid", "").isdigit():
        started = tags.get("ready.pid_started")
        return pid_alive(int(tags["ready.pid"]), float(started) if started not in (None, "", "None") else None)
    beat = float(tags.get("ready.heartbeat") or run.info.start_time / 1000)
    return (time.time() if now is None else now) - beat < STALE_AFTER_S


def live_claims(c, experiment_id: str, setting: str, config_hash: Optional[str] = None) -> dict[str, Any]:
    """Config hash -> the run that holds that job of `setting` (only `config_hash`'s when given): its
    newest FINISHED run, else a RUNNING one whose worker is alive. RUNNING runs of gone workers are
    marked KILLED on the way."""
    filt = f"tags.`ready.setting` = '{setting}' and tags.`ready.kind` = 'variant'"
    if config_hash:
        filt += f" and tags.`ready.config_hash` = '{config_hash}'"
    runs = retry(lambda: c.search_runs([experiment_id], filter_string=filt, max_results=5000,
                                       order_by=["attributes.start_time DESC"]))
    finished: dict[str, Any] = {}
    running: dict[str, Any] = {}
    for run in runs:  # newest first
        job = run.data.tags.get("ready.config_hash")
        if run.info.status == "FINISHED":
            finished.setdefault(job, run)
        elif run.info.status == "RUNNING":
            if claim_alive(run):
                running.setdefault(job, run)
            else:
                kill_run(c, run.info.run_id)
    return {**running, **finished}


@contextlib.contextmanager
def claim_lock(uri: str) -> Iterator[None]:
    """Held while a worker checks that nobody holds a job and starts the job's run, so two invocations
    never both start it: `<db>.lock` beside a sqlite store, else a lock file per tracking URI on this
    host (workers on several hosts share a sweep through one Optuna storage, which claims the trial)."""
    import hashlib

    prepare_store(uri)  # before the lock: it takes the sqlite lock itself
    db = _sqlite_file(uri)
    path = (db.with_name(db.name + ".lock") if db is not None else
            Path(tempfile.gettempdir()) / f"ready-claims-{hashlib.sha256(uri.encode()).hexdigest()[:16]}.lock")
    with _file_lock(path):
        yield


def beat(c, run_id: str) -> None:
    """Refresh a running child run's heartbeat (claim_alive reads it on other hosts)."""
    retry(lambda: c.set_tag(run_id, "ready.heartbeat", repr(time.time())))


def _system_metrics_available() -> bool:
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


class ChildRun:
    """One child run, open while a job trains and evaluates; `close` records how it ended."""

    def __init__(self, uri: str, experiment_id: str, parent_run_id: Optional[str], job, tags: dict[str, str]):
        import mlflow

        self._mlflow = mlflow
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        self.client = client(uri)
        mlflow.set_tracking_uri(uri)
        # what the UI's run table shows: "r=8 seed 0"; AR ignores the seed (one run serves them all)
        run_name = job.variant.label if job.variant.method == "ar" else f"{job.variant.label} seed {job.seed}"
        run = retry(lambda: mlflow.start_run(experiment_id=experiment_id, run_name=run_name,
                                             parent_run_id=parent_run_id, tags=tags,
                                             log_system_metrics=_system_metrics_available()))
        self.run_id = run.info.run_id
        self.job = job

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            retry(lambda: self.client.log_batch(self.run_id, params=items[i:i + 100]))

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None and math.isfinite(float(v))]
        for i in range(0, len(items), 500):
            retry(lambda: self.client.log_batch(self.run_id, metrics=items[i:i + 500]))

    def log_curves(self, curves: dict[str, list[tuple[int, float]]]) -> None:
        """Training curves as `train/<stage>/loss` with their optimizer step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(f"train/{stage}/loss", float(loss), now, int(step))
                 for stage, points in curves.items() for step, loss in points if math.isfinite(float(loss))]
        for i in range(0, len(items), 500):
            retry(lambda: self.client.log_batch(self.run_id, metrics=items[i:i + 500]))

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        retry(lambda: self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()]))

    def log_artifacts(self, cfg: DictConfig, evaluation: dict, survival: dict[str, list]) -> None:
        """config.yaml (resolved), evaluation.json, survival.png."""
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            Path(tmp, "evaluation.json").write_text(json.dumps(evaluation, indent=2, sort_keys=True, default=str))
            if survival:
                plot_survival(survival, Path(tmp, "survival.png"), title=f"{self.job.variant.label} (seed {self.job.seed})")
            for name in sorted(os.listdir(tmp)):
                retry(lambda: self.client.log_artifact(self.run_id, str(Path(tmp, name))))

    def close(self, status: str) -> None:
        retry(lambda: self._mlflow.end_run(status=status))


def plot_survival(curves: dict[str, list], path: Path, title: str = "") -> None:
    """Draft-prefix survival P_j per benchmark (positions with no observed round are skipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=100)
    for bench, values in curves.items():
        pts = [(j, v) for j, v in enumerate(values, start=1) if v is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=bench)
    ax.set_xlabel("draft position j")
    ax.set_ylabel("prefix survival P_j")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def kill_run(c, run_id: str) -> None:
    """Mark an interrupted child run KILLED (a re-run never mistakes it for finished work)."""
    try:
        run = c.get_run(run_id)
        if run.info.status == "RUNNING":
            retry(lambda: c.set_terminated(run_id, status="KILLED"))
    except Exception:
        pass


def reap_parents(c, experiment_id: str) -> int:
    """Mark KILLED every RUNNING parent (sweep) run started on this host by a process that is gone
    (e.g. SIGKILLed); its children are reaped with their trials. Returns how many were marked."""
    runs = retry(lambda: c.search_runs(
        [experiment_id], filter_string="tags.`ready.kind` = 'sweep' and attributes.status = 'RUNNING'",
        max_results=1000))
    n = 0
    for run in runs:
        tags = run.data.tags
        if tags.get("ready.host") != socket.gethostname() or not tags.get("ready.pid", "").isdigit():
            continue  # another host, or a run from before pids were recorded: cannot tell
        started = tags.get("ready.pid_started")
        started_f = float(started) if started not in (None, "", "None") else None
        if pid_alive(int(tags["ready.pid"]), started_f):
            continue
        kill_run(c, run.info.run_id)
        n += 1
    return n


def _benchmarks(metrics: dict[str, float]) -> list[str]:
    return sorted({k.split("/")[0] for k in metrics if k.endswith("/tps") and not k.startswith("train/")})


# drafting rows and the reference rows their paired gains are taken against (docs/interfaces.md):
# reference method -> the gain's name in `reports.stats.relative_metrics` ("" -> tau_gain_pct)
PAIRED_REFERENCES = {"dspark": "", "ft": "ft", "placebo": "placebo"}
DRAFTING_METHODS = ("dflash", "ft", "placebo", "ready")


def relative_metrics(metrics: dict[str, float], ar: Optional[dict[str, float]],
                     dspark: Optional[dict[str, float]], evaluation: Optional[dict] = None,
                     references: Optional[dict[str, dict]] = None) -> dict[str, float]:
    """`b/speedup` vs AR and `b/tau_gain_pct`, `b/tps_gain_pct` vs DSpark for every benchmark b.

    With this run's `evaluation` (evaluation.json) and `references` (reference method -> the
    evaluation.json of that method's run of the same seed), the τ gains become paired per-prompt
    estimates with 95 % intervals: `tau_gain_pct[_lo|_hi]` vs dspark, `tau_gain_vs_ft_pct[...]`,
    `tau_gain_vs_placebo_pct[...]` for each benchmark, `overall` and `heldout_tf` (reports.stats).
    """
    from reports.stats import relative_metrics as paired

    out: dict[str, float] = {}
    for b in _benchmarks(metrics):
        tps = metrics.get(f"{b}/tps")
        if ar and ar.get(f"{b}/tps"):
            value = speedup(tps, ar[f"{b}/tps"])
            if value is not None:
                out[f"{b}/speedup"] = value
        if dspark:
            for name in ("tau", "tps"):
                value = gain_pct(metrics.get(f"{b}/{name}"), dspark.get(f"{b}/{name}"))
                if value is not None:
                    out[f"{b}/{name}_gain_pct"] = value
    if evaluation is not None:
        for method, reference in (references or {}).items():
            if method in PAIRED_REFERENCES and reference is not None:
                out.update(paired(evaluation, reference, PAIRED_REFERENCES[method]))
    return out


def _same_seed(runs: list, seed: Optional[str]):
    """The newest run of `seed`; else the newest run when every run has one seed (a reference shared
    by all seeds, e.g. a spec that replicates only the adaptation stages); else None."""
    for run in runs:
        if run.data.tags.get("ready.seed") == seed:
            return run
    if runs and len({r.data.tags.get("ready.seed") for r in runs}) == 1:
        return runs[0]
    return None


def _evaluation_loader(c) -> Callable[[str], Optional[dict]]:
    """run id -> its evaluation.json as a dict (None when it has none); each run downloaded once."""
    cache: dict[str, Optional[dict]] = {}
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run is noise

    def load(run_id: str) -> Optional[dict]:
        if run_id not in cache:
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    path = retry(lambda: c.download_artifacts(run_id, "evaluation.json", tmp))
                    cache[run_id] = json.loads(Path(path).read_text())
            except Exception:  # no such artifact (older or failed runs): plain gains only
                cache[run_id] = None
        return cache[run_id]

    return load


def log_relative_metrics(c, experiment_id: str, setting: str, runs: Optional[Iterable] = None) -> int:
    """Fill in speedup / gains for the finished runs of a setting once its baselines exist.

    Gains vs DSpark use the DSpark run of the same seed (the newest DSpark run when none has it).
    Drafting runs (ft, placebo, ready) also get paired per-prompt gains with intervals against the
    dspark, ft and placebo runs of the same setting and seed, read from their evaluation.json.
    Idempotent: a metric is logged only when missing or different. Returns how many runs changed.
    """
    from mlflow.entities import Metric

    from reports.stats import StatsError

    ar = setting_runs(c, experiment_id, setting, "ar")
    refs = {m: setting_runs(c, experiment_id, setting, m) for m in PAIRED_REFERENCES}
    ar_m = ar[0].data.metrics if ar else None
    if ar_m is None and not any(refs.values()):
        return 0
    load = _evaluation_loader(c)
    changed = 0
    for run in runs if runs is not None else setting_runs(c, experiment_id, setting):
        have, tags = run.data.metrics, run.data.tags
        seed, method = tags.get("ready.seed"), tags.get("ready.method")
        ds = _same_seed(refs["dspark"], seed) or (refs["dspark"][0] if refs["dspark"] else None)
        evaluation, references = None, {}
        if method in DRAFTING_METHODS:
            references = {m: _same_seed(rs, seed) for m, rs in refs.items() if m != method}
            references = {m: load(r.info.run_id) for m, r in references.items() if r is not None}
            evaluation = load(run.info.run_id) if references else None
        try:
            rel = relative_metrics(have, ar_m, ds.data.metrics if ds else None, evaluation, references)
        except StatsError as e:  # rows that did not decode the same prompts: no paired gains
            logging.getLogger(__name__).warning("run %s: paired gains not computed: %s", run.info.run_id, e)
            rel = relative_metrics(have, ar_m, ds.data.metrics if ds else None)
        new = {k: v for k, v in rel.items()
               if k not in have or not math.isclose(have[k], v, rel_tol=1e-9, abs_tol=1e-12)}
        if new:
            now = int(time.time() * 1000)
            retry(lambda: c.log_batch(run.info.run_id, metrics=[Metric(k, v, now, 0) for k, v in new.items()]))
            changed += 1
    return changed
