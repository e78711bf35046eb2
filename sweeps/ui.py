"""`python -m sweeps.ui [SWEEP]`: open MLflow's UI on the store a sweep wrote, at that sweep's run table.

    ready ui                      # the store of this folder (sqlite:///mlflow.db): every experiment
    ready ui rank                 # ... and the link to the rank sweep's run table
    ready ui rank --tracking-uri sqlite:////data/mlflow.db --port 5001
    ready ui rank --print         # the command and the link, without starting anything

It runs `mlflow ui --backend-store-uri URI` with the mlflow of this Python (no activated environment
needed) until Ctrl-C. A sqlite store that does not exist is one line, never an empty UI; a tracking
server (http) is a UI already: its link is printed and nothing is started. `command` is how the sweep's
closing lines spell a `ready` command so that it runs as printed in the shell that started the sweep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from ready.config import entry_point
from sweeps import tracking


def command(args: str) -> str:
    """`ready ARGS` as it runs in this shell: `ready` when the one on PATH is this environment's, else
    the path of this environment's `ready` script, else `python -m sweeps.cli` with this interpreter."""
    script = Path(sys.executable).parent / "ready"
    found = shutil.which("ready")
    if found and script.is_file() and Path(found).resolve() == script.resolve():
        return f"ready {args}"
    if script.is_file():
        try:
            shown = script.relative_to(Path.cwd())
        except ValueError:
            shown = script
        return f"{shown} {args}"
    return f"{sys.executable} -m sweeps.cli {args}"


def link(uri: str, sweep: Optional[str], host: str = "127.0.0.1", port: int = 5000) -> str:
    """The address of `sweep`'s run table (MLflow's training view, not its GenAI view: docs/sweeps.md), or
    of the UI's start page."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else f"http://{host}:{port}"
    if sweep is None:
        return f"{base}/"
    exp = tracking.client(uri).get_experiment_by_name(tracking.experiment_name(sweep))
    if exp is None:
        raise tracking.TrackingError(f"tracking URI {uri!r} has no experiment {tracking.experiment_name(sweep)!r}; "
                                     f"expected a sweep that ran there (python -m sweeps.run {sweep})")
    return f"{base}/#/experiments/{exp.experiment_id}?workflowType=machine_learning"


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """`mlflow ui` on `uri` with this interpreter's mlflow."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.ui", description=__doc__.split("\n")[0])
    p.add_argument("sweep", nargs="?", default=None, help="the sweep whose run table to link (default: none)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db in this folder)")
    p.add_argument("--host", default="127.0.0.1", help="address the UI listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5000, help="port of the UI (default 5000)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the command and the link; start nothing")
    args = p.parse_args(argv)
    uri = tracking.resolve_tracking_uri(args.tracking_uri)
    db = tracking._sqlite_file(uri)
    if db is not None and not db.is_file():
        print(f"error: tracking URI {uri!r}: {db} does not exist; expected the mlflow.db a sweep wrote (run "
              "python -m sweeps.run NAME here first, or pass --tracking-uri)", file=sys.stderr)
        return 2
    try:
        address = link(uri, args.sweep, args.host, args.port)
    except tracking.TrackingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if db is None:  # a tracking server is its own UI
        print(f"[ui] {uri} is a tracking server: open {address}")
        return 0
    cmd = ui_command(uri, args.host, args.port)
    print(f"[ui] {' '.join(cmd)}\n[ui] open {address} (Ctrl-C stops the UI)", flush=True)
    if args.print_only:
        return 0
    try:
        return subprocess.call(cmd, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
