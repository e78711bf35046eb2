"""`python -m sweeps.relocate DIR/mlflow.db`: point a moved MLflow sqlite store at its artifacts again.

    python -m sweeps.relocate /tmp/gpu-run/mlflow.db            # artifacts in /tmp/gpu-run/mlruns
    python -m reports.build --tracking-uri sqlite:////tmp/gpu-run/mlflow.db --sweep ft_control

A sqlite store records every artifact location as an absolute path of the machine that wrote it
(`<the writer's working directory>/mlruns/<experiment>/<run>/artifacts`). A sweep run on a GPU machine
and brought back (the store and its `mlruns` folder side by side) therefore points at paths that do not
exist here, and `reports.build` cannot read the runs' evaluation.json. This rewrites, in every table of
the store, each location's part before `/mlruns` to the folder given (default: `mlruns` beside the
database), in place; a location without `/mlruns` is left as it is. Run it on a writable copy.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path
from typing import Optional, Sequence

from ready.config import entry_point

COLUMNS = ("artifact_location", "artifact_uri")
MARK = "/mlruns"


def moved(location: str, root: Path) -> Optional[str]:
    """`location` with its part up to `/mlruns` replaced by `root` (same form: a path or a file:// URI);
    None when it holds no `/mlruns` segment."""
    i = location.find(MARK + "/")
    if i < 0:
        if not location.endswith(MARK):
            return None
        i = len(location) - len(MARK)
    rest = location[i + len(MARK):]
    return (root.as_uri() if location.startswith("file:") else str(root)) + rest


def relocate(db: Path, root: Optional[Path] = None) -> int:
    """Rewrite the artifact locations of the sqlite store `db` to lie under `root` (default `<db's folder>/mlruns`);
    returns how many were changed."""
    if not db.is_file():
        raise FileNotFoundError(f"{db}: no such file; expected an MLflow sqlite database (mlflow.db)")
    root = (root or db.parent / "mlruns").resolve()
    changed = 0
    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")') if r[1] in COLUMNS]
            for col in cols:
                for rowid, value in con.execute(f'SELECT rowid, "{col}" FROM "{table}"').fetchall():
                    new = moved(value, root) if isinstance(value, str) else None
                    if new is not None and new != value:
                        con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE rowid = ?', (new, rowid))
                        changed += 1
    return changed


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.relocate", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("db", help="the store's database file, or its sqlite:/// URI")
    ap.add_argument("--artifacts", default=None, help="the folder the artifacts are in now (default: mlruns beside db)")
    a = ap.parse_args(argv)
    db = Path(a.db.removeprefix("sqlite:///") if a.db.startswith("sqlite:///") else a.db)
    artifacts = Path(a.artifacts) if a.artifacts else None
    if artifacts is not None and not artifacts.is_dir():
        print(f"error: --artifacts {artifacts}: no such folder; expected the store's mlruns folder", file=sys.stderr)
        return 2
    try:
        n = relocate(db, artifacts)
    except (OSError, sqlite3.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[sweeps] {db}: {n} artifact location(s) now under {(artifacts or db.parent / 'mlruns').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
