"""`python -m sweeps.run NAME [key=value ...]`: train and evaluate every row of a sweep.

    python -m sweeps.run --list                      # the sweeps in experiments/
    python -m sweeps.run rank --dry-run              # resolved rows with their hashes
    python -m sweeps.run rank profile=smoke          # a one-minute CPU check
    python -m sweeps.run rank --workers 4            # four local workers (one GPU each when present)
    python -m sweeps.run rank --storage postgresql://user@db/optuna --tracking-uri postgresql://user@db/mlflow
                                                     # one worker per host, same command on every host

Overrides: `preset=NAME`, `profile=NAME`, `seeds=[0,1,2]`, `search.n_trials=N`, and any config key
`a.b=v` (see experiments/base.yaml). The run folder (`runs/<sweep>/`) holds the Optuna journal
and the workers' logs; MLflow holds the results (`sqlite:///mlflow.db` unless told otherwise).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from ready.allocator import keep_freed_memory
from ready.config import ConfigError, entry_point, length_mismatch
from ready.data.corpus import load_corpus
from reports.mlflow_store import DEFAULT_TRACKING_URI, redact
from sweeps import study as st
from sweeps import tracking
from sweeps.prepare import prepare_artifacts, release_shared
from sweeps.spec import EXPERIMENTS_DIR, Sweep, axis_settings, list_sweeps, load_sweep
from sweeps.table import render
from sweeps.ui import command


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sweeps.run", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="sweep name (a file experiments/<name>.yaml)")
    p.add_argument("overrides", nargs="*", help="key=value overrides (preset=, profile=, seeds=, a.b=v)")
    p.add_argument("--list", action="store_true", help="list the sweeps and exit")
    p.add_argument("--dry-run", action="store_true", help="print the resolved rows with their hashes and exit")
    p.add_argument("--cost", action="store_true",
                   help="with or without --dry-run: print the rows' estimated GPU-hours on 1 and --gpus GPUs from the "
                        "preset's measured rates (experiments/presets/<preset>.rates.json) and exit")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the --cost estimate's second column (default 8)")
    p.add_argument("--workers", type=int, default=None,
                   help="local worker processes (default: one per idle core on a machine without GPUs, each with "
                        "one thread; 1 with GPUs, run in this process)")
    p.add_argument("--storage", default=None, help="Optuna storage URL (default: journal file under the run folder)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--run-dir", default=None, help="run folder (default runs/<sweep>)")
    p.add_argument("--runner", default=st.DEFAULT_RUNNER, help="module providing run_variant(cfg, method) [and prepare_shared]")
    p.add_argument("--experiments-dir", default=str(EXPERIMENTS_DIR), help=argparse.SUPPRESS)
    p.add_argument("--reports-dir", default="reports/out", help="where the tables go (default reports/out, as python -m reports.build)")
    p.add_argument("--no-report", action="store_true", help="skip reports.build_reports at the end")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--threads", default=None, help=argparse.SUPPRESS)  # gone: the config's threads.* (a clear error)
    return p.parse_intermixed_args(argv)


def _cpu_times() -> Optional[tuple[int, int, int]]:
    """(total, idle + iowait, CPUs) from /proc/stat, or None where there is none."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:]]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0), cpus


def _busy_cpus(sample_s: float = 0.5) -> Optional[float]:
    """CPUs busy now: the non-idle share of the CPU time over `sample_s` seconds times the CPUs, or
    None off Linux. (The load average lags by a minute: right after one sweep ends it still counts
    that sweep's cores as busy, and the next sweep would start on fewer.)"""
    a = _cpu_times()
    if a is None:
        return None
    time.sleep(sample_s)
    b = _cpu_times()
    total, idle = b[0] - a[0], b[1] - a[1]
    return b[2] * (total - idle) / total if total > 0 else 0.0


def idle_cores() -> int:
    """The cores that are idle now (at least 1). Threads beyond them spin against other jobs: on the
    shared 2-core box a pretraining step took 17 s with 2 threads beside another job, 2 s with 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    busy = _busy_cpus()
    if busy is None:
        busy = os.getloadavg()[0]
    return max(1, min(cores, round(cores - busy)))


def default_workers(idle: Optional[int] = None, threads: int = 1) -> int:
    """Workers when --workers is not given: as many rows of `threads` torch threads each as the idle
    cores hold without GPUs (the embedded default's rows are small: one process per core beats one
    process with several threads), else 1."""
    return 1 if gpu_ids() else max(1, (idle or idle_cores()) // max(1, threads))


def dry_run_table(sweep: Sweep) -> str:
    rows = []
    for job in sweep.jobs_in_table_order():
        v = job.variant
        swept = ", ".join(f"{k}={val}" for k, val in v.swept.items())
        rows.append([v.order, v.label, v.method, job.seed, v.variant_id, job.config_hash, swept])
    title = (f"sweep {sweep.name} ({sweep.table or 'search'}), preset {sweep.preset}"
             f"{', profile ' + sweep.profile if sweep.profile else ''}, setting {sweep.setting}, "
             f"{len(sweep.variants)} variants x {len(sweep.seeds)} seed(s) + {len(sweep.baselines)} baseline(s)")
    out = render(["order", "label", "method", "seed", "variant_id", "config_hash", "swept"], rows, title=title)
    if sweep.spec.search is not None and sweep.spec.search.n_trials > 0:
        s = sweep.spec.search
        ranges = ", ".join(f"{k} in [{r.low:g}, {r.high:g}]{' log' if r.log else ''}" for k, r in s.params.items())
        out += f"\n+ TPE search: {s.n_trials} trials, {s.direction} {s.objective}, {ranges}"
    return out


def summary_table(sweep: Sweep, c, experiment_id: str, ran: set[str], failed: set[str],
                  elsewhere: set[str] = frozenset()) -> tuple[str, int]:
    """Every row of this setting with its status and headline numbers; also counts what is missing
    (a row another worker or host is still running is not missing)."""
    runs = {r.data.tags.get("ready.config_hash"): r for r in tracking.setting_runs(c, experiment_id, sweep.setting)}
    ordered = sweep.jobs_in_table_order()
    hashes = [j.config_hash for j in ordered]
    jobs = {j.config_hash: j for j in ordered}
    extra = [h for h in runs if h not in jobs]  # search trials
    extra.sort(key=lambda h: int(runs[h].data.tags.get("ready.order", "0")))
    rows, missing = [], 0
    for h in hashes + extra:
        run = runs.get(h)
        if h in jobs:
            label, method, seed = jobs[h].variant.label, jobs[h].variant.method, jobs[h].seed
        else:
            t = run.data.tags
            label, method, seed = t.get("ready.label"), t.get("ready.method"), t.get("ready.seed")
        status = "failed" if h in failed else ("ran" if h in ran else ("skipped" if run is not None else "missing"))
        if run is None and h in elsewhere and h not in failed:
            status = "running elsewhere"
        if run is None:
            missing += status != "running elsewhere"
            rows.append([label, method, seed, status, None, None, None, None, None, h])
            continue
        m = run.data.metrics
        lossless = m.get("overall/lossless")
        rows.append([label, method, seed, status, m.get("overall/tau"), m.get("overall/tps"), m.get("overall/speedup"),
                     m.get("overall/tps_gain_pct"), None if lossless is None else int(lossless), h])
    title = f"sweep {sweep.name}: {len(rows)} runs of setting {sweep.setting} (overall = mean over benchmarks)"
    return render(["label", "method", "seed", "status", "tau", "tps", "speedup", "tps_gain%", "lossless", "config_hash"],
                  rows, title=title), missing


def gpu_ids() -> list[str]:
    """The GPUs workers can be pinned to (honouring an existing CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def gpu_groups(gpus: list[str], workers: int, per_worker: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each worker: `per_worker` consecutive GPUs (a row's data-parallel
    training, `train.devices`), groups handed out round-robin when the workers need more GPUs than
    there are (8 GPUs, 4 workers, 2 each: "0,1", "2,3", "4,5", "6,7")."""
    k = max(1, min(per_worker, len(gpus)))
    n_groups = max(1, len(gpus) // k)
    return [",".join(gpus[(i % n_groups) * k:(i % n_groups) * k + k]) for i in range(workers)]


def spawn_workers(args: argparse.Namespace, sweep: Sweep, run_dir: Path, uri: str, experiment_id: str,
                  parent_id: str) -> int:
    """Start `--workers` processes (`python -m sweeps.worker`), each with `train.devices` GPUs (one
    by default) when there are GPUs."""
    gpus = gpu_ids()
    per_worker = max(int(job.cfg.train.devices) for job in sweep.jobs()) if sweep.jobs() else 1
    if gpus and args.workers * per_worker > len(gpus):
        print(f"[sweeps] {args.workers} workers x {per_worker} GPU(s) (train.devices) share {len(gpus)} GPU(s) "
              "round-robin", flush=True)
    groups = gpu_groups(gpus, args.workers, per_worker) if gpus else []
    procs = []
    for i in range(args.workers):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = groups[i]
        cmd = [sys.executable, "-m", "sweeps.worker", sweep.name, *sweep.overrides,
               "--storage", args.storage or "", "--run-dir", str(run_dir), "--tracking-uri", uri,
               "--experiment-id", experiment_id, "--parent-run-id", parent_id, "--runner", args.runner,
               "--experiments-dir", args.experiments_dir, "--index", str(i)]
        log = open(run_dir / f"worker-{i}.log", "ab")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        print(f"[sweeps] worker {i}: pid {procs[-1][0].pid}, CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!s}, "
              f"log {run_dir / f'worker-{i}.log'}", flush=True)
    try:
        _watch(procs, sweep, args, run_dir)
    except KeyboardInterrupt:
        for p, _ in procs:
            p.terminate()
        raise
    finally:
        for p, log in procs:
            p.wait()
            log.close()
    return max(p.returncode for p, _ in procs)


def _watch(procs, sweep: Sweep, args: argparse.Namespace, run_dir: Path) -> None:
    """A progress bar over the grid study's finished trials while the workers run."""
    from tqdm.auto import tqdm

    storage = st.open_storage(args.storage, run_dir)
    grid = st.open_grid_study(storage, sweep)
    from optuna.trial import TrialState

    def open_trials() -> int:
        return len(grid.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)))

    total = open_trials()
    bar = tqdm(total=total, desc=f"{sweep.name} rows", disable=args.quiet or total == 0)
    while any(p.poll() is None for p, _ in procs):
        bar.n = max(0, total - open_trials())
        bar.refresh()
        time.sleep(2.0)
    bar.n = max(0, total - open_trials())
    bar.close()


def _signals_as_interrupt() -> None:
    """SIGTERM and SIGINT unwind like Ctrl-C, so runs and trials are marked KILLED/FAIL rather than left
    RUNNING. SIGINT is set too because a process started in the background of a script inherits it
    ignored (the shell's rule for jobs without job control): `kill -INT` was then ignored in silence."""
    import signal
    import threading

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(render(["sweep", "table / description"], sorted(list_sweeps(Path(args.experiments_dir)).items())))
        return 0
    if not args.name:
        print("error: give a sweep name (python -m sweeps.run --list shows them)", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"error: --workers {args.workers}: expected an integer >= 1", file=sys.stderr)
        return 2
    if args.threads is not None:
        print(f"error: --threads {args.threads}: the torch thread counts are the config keys threads.shared=K (the shared "
              "builds) and threads.drafters=K (each row), hashed because they change the numbers", file=sys.stderr)
        return 2
    try:  # a spec with setting axes runs once per setting (sweeps.spec.axis_settings)
        settings = axis_settings(args.name, args.overrides, Path(args.experiments_dir))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    code = 0
    for overrides in settings:
        if len(settings) > 1:
            print(f"[sweeps] {args.name}: setting {' '.join(overrides[len(args.overrides):])}", flush=True)
        code = max(code, _main_setting(args, overrides))
        if code in (2, 130):  # a user error or an interrupt: the other settings would meet it too
            break
    return code


def _main_setting(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    """`main` for one sweep setting (the command line's overrides plus its axis values)."""
    try:
        sweep = load_sweep(args.name, overrides, Path(args.experiments_dir))
    except ConfigError as e:  # a SpecError, or a config key's value the sweep cannot use
        print(f"error: {e}", file=sys.stderr)
        return 2
    mismatch = {length_mismatch(v.cfg) for v in sweep.rows if v.method != "ar"} - {None}
    for why in sorted(mismatch):
        print(f"[sweeps] warning: {why}", file=sys.stderr, flush=True)
    if args.dry_run or args.cost:
        print(dry_run_table(sweep))
        if args.cost:
            from sweeps.cost import CostError, report

            if args.gpus < 1:
                print(f"error: --gpus {args.gpus}: expected an integer >= 1", file=sys.stderr)
                return 2
            try:
                print(report(sweep, args.gpus, Path(args.experiments_dir)))
            except CostError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        return 0
    _signals_as_interrupt()
    idle = idle_cores()
    shared, per_row = int(sweep.common.threads.shared), max(int(v.cfg.threads.drafters) for v in sweep.rows)
    if args.workers is None:
        args.workers = max(1, min(default_workers(idle, per_row), len(sweep.jobs())))
    os.environ["OMP_NUM_THREADS"] = str(per_row)  # worker processes start torch with a row's threads
    wanted = max(shared, per_row * args.workers)
    if wanted > idle:  # threads beyond the idle cores would spin against the other jobs: let them sleep instead
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch starts, which it has not here yet
        print(f"[sweeps] warning: {idle} idle core(s) for up to {wanted} torch threads: the same numbers, but slower (the "
              "embedded target's pretraining on 2 threads beside a one-core job: 5-8 s a step instead of 0.55); "
              "threads.shared=1 is fast there and builds another target", file=sys.stderr, flush=True)
    if not args.quiet:
        print(f"[sweeps] {args.workers} worker(s); torch CPU threads: {shared} for the shared builds, {per_row} per row "
              "(threads.shared, threads.drafters: they change the numbers, so they are config keys)", flush=True)
    try:
        return run_sweep(sweep, args)
    except KeyboardInterrupt:
        print("[sweeps] interrupted; a re-run picks up the unfinished rows", file=sys.stderr, flush=True)
        return 130
    except ValueError as e:  # the project's user errors (bad path, bad benchmark file, bad checkpoint)
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    except OSError as e:  # the machine's: a full disk, a read-only or forbidden path (else a bug: its traceback)
        if st.machine_fault(e) is None:
            raise
        print(f"error: {st.machine_fault(e)}; expected free space and write access there", file=sys.stderr)
        return 2


def run_sweep(sweep: Sweep, args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or Path("runs") / sweep.name).resolve()
    st.check_run_dir(run_dir)
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    c = tracking.client(uri)
    experiment_id = tracking.ensure_experiment(c, sweep.name, sweep.spec.description)
    reaped = tracking.reap_parents(c, experiment_id)
    if reaped:
        print(f"[sweeps] marked {reaped} sweep run(s) KILLED: their process on this host is gone", flush=True)
    storage = st.open_storage(args.storage, run_dir)
    grid = st.open_grid_study(storage, sweep)
    print(f"[sweeps] {sweep.name}: study {st.grid_study_name(sweep)} in {st.describe_storage(args.storage, run_dir)}; "
          f"MLflow {redact(uri)}, experiment {tracking.experiment_name(sweep.name)}", flush=True)
    print(f"[sweeps] {load_corpus(sweep.common.corpus).describe()}", flush=True)  # in the setting hash too

    rows = st.plan(grid, sweep, c, experiment_id)
    counts = {s: sum(r.status == s for r in rows) for s in ("finished", "queued", "waiting", "running")}
    print(f"[sweeps] {len(rows)} runs: {counts['finished']} finished (skipped), {counts['queued']} queued, "
          f"{counts['waiting']} already queued, {counts['running']} running elsewhere", flush=True)
    searching = sweep.spec.search is not None and int(sweep.spec.search.n_trials) > 0
    if searching:
        st.seed_search(storage, sweep)
    todo = counts["queued"] + counts["waiting"] > 0 or searching
    parent_id = tracking.start_parent(c, experiment_id, sweep, st.describe_storage(args.storage, run_dir), args.workers)
    ctx = st.WorkerContext(tracking_uri=uri, experiment_id=experiment_id, parent_run_id=parent_id,
                           runner=args.runner, progress=not args.quiet)
    code = 0
    status = "FINISHED"
    try:
        if todo:
            keep_freed_memory()  # this process's training steps reuse their pages (ready.allocator)
            prepare_artifacts(args.runner, sweep, progress=not args.quiet, workers=args.workers, gpus=bool(gpu_ids()))
            log_prepare_phases(c, parent_id)
            if args.workers == 1:
                code = st.worker_main(sweep, args.storage, run_dir, ctx)
            else:
                keep_freed_memory(False)  # the shared artifacts' heap goes back before the workers start
                release_shared(args.runner)  # the target it kept goes back too: worker 0 shares this GPU
                code = spawn_workers(args, sweep, run_dir, uri, experiment_id, parent_id)
        tracking.log_relative_metrics(c, experiment_id, sweep.setting)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception:
        status = "FAILED"
        raise
    finally:
        ran, failed = set(ctx.ran), set(ctx.failed)
        if args.workers > 1:  # the workers' own records are in the study
            more_ran, more_failed = _outcomes(grid, parent_id)
            ran, failed = ran | more_ran, failed | more_failed
        elsewhere = _running_elsewhere(grid, c, experiment_id, sweep.setting, parent_id)
        text, missing = summary_table(sweep, c, experiment_id, ran, failed, elsewhere)
        print(text, flush=True)
        if status == "FINISHED" and (code or missing):
            status = "FAILED"
        retry_end = lambda: c.set_terminated(parent_id, status=status)  # noqa: E731
        tracking.retry(retry_end)
    if not args.no_report and status == "FINISHED":
        _report(uri, sweep, Path(args.reports_dir))
    return 0 if status == "FINISHED" else 1


def log_prepare_phases(c, parent_id: str) -> None:
    """The shared builds' phases (target load, AR generations, regeneration, base drafter: ready.phases) as
    `prepare/<name>_s` and `prepare/<name>_peak_gb` metrics of the sweep's parent run."""
    from mlflow.entities import Metric

    from ready.phases import PHASES, phase_metrics

    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in phase_metrics(PHASES.take(), prefix="prepare").items()]
    if metrics:
        tracking.retry(lambda: c.log_batch(parent_id, metrics=metrics))


def _running_elsewhere(grid, c, experiment_id: str, setting: str, parent_id: str) -> set[str]:
    """Jobs running under a live worker this invocation did not start: a RUNNING trial of its study
    (another host), or a RUNNING run in the store of another invocation (another run folder)."""
    from optuna.trial import TrialState

    trials = {t.user_attrs["job"] for t in grid.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
              if "job" in t.user_attrs and not st.is_stale(t)}
    runs = {job for job, run in tracking.live_claims(c, experiment_id, setting).items()
            if run.info.status == "RUNNING" and run.data.tags.get("mlflow.parentRunId") != parent_id}
    return trials | runs


def _outcomes(grid, parent_id: str) -> tuple[set[str], set[str]]:
    """Config hashes the workers of this invocation ran and failed (from the grid study)."""
    from optuna.trial import TrialState

    ran, failed = set(), set()
    for t in grid.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if t.user_attrs.get("parent_run_id") == parent_id and "job" in t.user_attrs:
            (ran if t.state == TrialState.COMPLETE else failed).add(t.user_attrs["job"])
    return ran, failed


def _report(uri: str, sweep: Sweep, out_dir: Path) -> None:
    try:
        from reports.build import build_reports
    except ImportError:
        print("[sweeps] reports/ not available; skipping the tables", flush=True)
        return
    try:
        files = build_reports(uri, [sweep.name], out_dir)
        print(f"[sweeps] reports: {', '.join(str(f) for f in files)}", flush=True)
        # the store named unless it is ./mlflow.db (MLflow exports the URI into this process's environment, not
        # into the shell's, so the environment here cannot tell what a command in that shell would find)
        store = "" if uri == tracking.resolve_tracking_uri(DEFAULT_TRACKING_URI) else f" --tracking-uri {uri}"
        # `ready ui` opens the run table, not MLflow's GenAI view (docs/sweeps.md); commands run as printed
        print(f"[sweeps] compare the runs: {command(f'ui {sweep.name}{store}')}", flush=True)
        _findings_hint(uri, sweep, store)
    except Exception as e:  # a report problem must not hide that the sweep itself finished
        print(f"[sweeps] reports failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _findings_hint(uri: str, sweep: Sweep, store: str) -> None:
    """Name the sweeps the paper's findings read (`reports.findings`) and the command of each one this
    store has no runs of yet (made with this sweep's profile; the positive control with its own)."""
    from reports import collect
    from reports.errors import ReportError
    from reports.findings import FINDINGS, POSITIVE_CONTROL, profile_runs

    profile = f" profile={sweep.profile}" if sweep.profile else ""
    stored = set(collect.list_sweeps(uri))
    missing = []
    for f in (POSITIVE_CONTROL, *FINDINGS):
        try:
            if f.sweep not in stored:
                raise ReportError(f.sweep)
            if f is not POSITIVE_CONTROL:
                profile_runs(collect.load_runs(uri, f.sweep), f.sweep, sweep.profile)
        except ReportError:
            missing.append(command(f"sweep {f.sweep}{'' if f is POSITIVE_CONTROL else profile}{store}"))
    judge = command(f"findings{f' --profile {sweep.profile}' if sweep.profile else ''}{store}")
    print(f"[sweeps] the paper's findings: {judge} judges them from sweeps "
          f"{', '.join(f.sweep for f in (POSITIVE_CONTROL, *FINDINGS))}"
          + (f"; not run yet: {'; '.join(missing)}" if missing else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
