"""`python -m sweeps.worker NAME [overrides] ...`: one worker process of a sweep (started by
`python -m sweeps.run --workers N`; not meant to be typed by hand)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ready.allocator import keep_freed_memory
from sweeps import study as st
from sweeps.run import _signals_as_interrupt
from sweeps.spec import load_sweep


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sweeps.worker")
    p.add_argument("name")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--storage", default="")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--experiment-id", required=True)
    p.add_argument("--parent-run-id", default=None)
    p.add_argument("--runner", default=st.DEFAULT_RUNNER)
    p.add_argument("--experiments-dir", required=True)
    p.add_argument("--index", type=int, default=0)
    args = p.parse_args(argv)
    sweep = load_sweep(args.name, args.overrides, Path(args.experiments_dir))
    ctx = st.WorkerContext(tracking_uri=args.tracking_uri, experiment_id=args.experiment_id,
                           parent_run_id=args.parent_run_id or None, runner=args.runner, progress=True,
                           index=args.index)

    _signals_as_interrupt()
    keep_freed_memory()  # a row's training steps reuse their pages (ready.allocator)
    try:
        return st.worker_main(sweep, args.storage or None, Path(args.run_dir), ctx)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
