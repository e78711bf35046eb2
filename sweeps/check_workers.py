"""Check that several workers share one sweep: every variant runs once, nothing is lost.

    python -m sweeps.check_workers rank profile=smoke --workers 2 --json

Three real `python -m sweeps.run` invocations, each in its own sweep setting (seeds differ) and
a fresh MLflow store under --out:

1. `--workers N`: wall time, and per finished child run its `CUDA_VISIBLE_DEVICES`;
2. `--workers 1`: wall time of the same amount of work in one process;
3. `--workers N` where worker 0 is killed (SIGKILL) while it runs a variant, then the same
   command again: the other workers finish their own variants, the re-run finishes the
   killed one, and no variant ends with two finished runs.

Prints one JSON object; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from mlflow.tracking import MlflowClient

from ready.config import entry_point


def _sweep_cmd(name: str, overrides: list[str], workers: int, uri: str, run_dir: Path, runner: Optional[str]) -> list[str]:
    extra = ["--runner", runner] if runner else []
    return [sys.executable, "-m", "sweeps.run", name, *overrides, "--workers", str(workers),
            "--tracking-uri", uri, "--run-dir", str(run_dir), "--no-report", "--quiet", *extra]


def _runs(uri: str, experiment: str) -> list:
    """Every child run (variants and baselines) in one phase's own store."""
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return c.search_runs([exp.experiment_id], "tags.`ready.kind` = 'variant'", max_results=5000)


def _finished(runs: list) -> Counter:
    return Counter(r.data.tags.get("ready.config_hash") for r in runs if r.info.status == "FINISHED")


def _timed(cmd: list[str], log: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.perf_counter() - t0


def _kill_one_worker(cmd: list[str], log: Path, run_dir: Path, timeout: float) -> tuple[int, Optional[str]]:
    """Run the sweep; SIGKILL worker 0 as soon as its log shows it started a variant."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        pid, killed_label, t0 = None, None, time.time()
        while proc.poll() is None and time.time() - t0 < timeout:
            time.sleep(0.5)
            text = log.read_text(errors="replace")
            if pid is None:
                m = re.search(r"worker 0: pid (\d+)", text)
                pid = int(m.group(1)) if m else None
            wlog = run_dir / "worker-0.log"
            if pid and killed_label is None and wlog.exists():
                started = re.findall(r"\[sweeps\] run  (.+?) \(seed", wlog.read_text(errors="replace"))
                if started:
                    time.sleep(1.0)  # well inside the variant
                    os.kill(pid, signal.SIGKILL)
                    killed_label = started[-1]
        return proc.wait(), killed_label


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder for the stores and logs (default: a temp folder)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--runner", default=None, help="run_variant module passed to sweeps.run (default: the real pipeline)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="check-workers-"))
    out.mkdir(parents=True, exist_ok=True)
    experiment = f"ready-{a.name}"
    res: dict = {"sweep": a.name, "overrides": a.overrides, "workers": a.workers, "out": str(out)}
    ok = True

    # 1 + 2: N workers vs one, each its own setting (seed) and store
    for tag, workers, seed in (("parallel", a.workers, 101), ("serial", 1, 102)):
        uri = f"sqlite:///{out / (tag + '.db')}"
        rc, wall = _timed(_sweep_cmd(a.name, [*a.overrides, f"seeds=[{seed}]"], workers, uri, out / tag, a.runner), out / f"{tag}.log")
        runs = _runs(uri, experiment)
        fin = _finished(runs)
        res[tag] = {"rc": rc, "wall_s": round(wall, 1), "finished_runs": sum(fin.values()),
                    "variants": len(fin), "duplicates": sorted(h for h, n in fin.items() if n > 1),
                    "cuda_visible_devices": sorted(Counter(r.data.tags.get("ready.cuda_visible_devices", "")
                                                           for r in runs if r.info.status == "FINISHED").items())}
        ok &= rc == 0 and not res[tag]["duplicates"]
    if res["serial"]["wall_s"]:
        res["speedup"] = round(res["serial"]["wall_s"] / res["parallel"]["wall_s"], 2)

    # 3: kill worker 0 mid-variant, then re-run
    uri = f"sqlite:///{out / 'kill.db'}"
    cmd = _sweep_cmd(a.name, [*a.overrides, "seeds=[103]"], a.workers, uri, out / "kill", a.runner)
    rc1, killed = _kill_one_worker(cmd, out / "kill-1.log", out / "kill", a.timeout)
    after_kill = _runs(uri, experiment)
    rc2, _ = _timed(cmd, out / "kill-2.log")
    final = _runs(uri, experiment)
    fin = _finished(final)
    expected = res["parallel"]["variants"]
    res["kill"] = {"killed_variant": killed, "rc_first": rc1, "rc_rerun": rc2,
                   "finished_after_kill": sum(_finished(after_kill).values()),
                   "statuses_after_kill": sorted(Counter(r.info.status for r in after_kill).items()),
                   "finished_after_rerun": sum(fin.values()), "variants_after_rerun": len(fin),
                   "duplicates": sorted(h for h, n in fin.items() if n > 1)}
    ok &= killed is not None and rc2 == 0 and not res["kill"]["duplicates"] and len(fin) == expected
    res["ok"] = bool(ok)
    print(json.dumps(res, indent=None if a.json else 2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
