"""Export a drafter as a DSpark folder that SpecForge, DeepSpec and SGLang's DSpark worker load.

    python -m sweeps.commands.export SRC OUT [--dtype bfloat16] [--tracking-uri sqlite:///mlflow.db] [--allow-unfinished]

SRC is a drafter folder or the MLflow run id of a sweep row; OUT is new, empty, or an earlier export left as
it was. What is checked and written, and why: `ready.drafter.export`, which this command line calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from ready.config import entry_point
from ready.drafter.export import DTYPES, export, resolve_source
from ready.drafter.model import DrafterError


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.commands.export", description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a drafter folder, or the MLflow run id of a sweep row (runs:/ID or ID)")
    ap.add_argument("out", help="the DSpark folder to write: new, or an earlier export (nothing else is replaced)")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights (default: as saved)")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow store of the run (default %(default)s)")
    ap.add_argument("--allow-unfinished", action="store_true",
                    help="export the drafter of a run that did not finish (FAILED, KILLED, RUNNING), with a warning")
    a = ap.parse_args(argv)
    try:
        source = resolve_source(a.src, a.tracking_uri, unfinished="warn" if a.allow_unfinished else "refuse")
        out = export(source, Path(a.out), a.dtype)
    except DrafterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # OUT under a file, a read-only folder, a full disk
        print(f"error: {a.out}: cannot write the export ({e.strerror or e}); expected a writable place for a new "
              "folder", file=sys.stderr)
        return 2
    print(json.dumps({"exported": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
