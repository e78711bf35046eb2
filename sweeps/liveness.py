"""Is a sweep worker still alive? Its pid on this host, else its heartbeat (the study's trials, the store's runs).

`sweeps.study` (Optuna trials) and `sweeps.tracking` (MLflow claims) both ask; a worker whose pid is
gone from this host, or whose heartbeat is older than STALE_AFTER_S elsewhere, holds nothing.
"""

from __future__ import annotations

import os
from typing import Optional

STALE_AFTER_S = 600.0


def pid_alive(pid: int, started: Optional[float]) -> bool:
    """Whether process `pid` of this host runs, and is the one started at `started` (epoch s; None: any)."""
    try:
        import psutil

        if not psutil.pid_exists(pid):
            return False
        return started is None or abs(psutil.Process(pid).create_time() - started) < 1.0
    except ImportError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    except Exception:  # the process ended between the two calls
        return False


def process_start() -> Optional[float]:
    """When this process started (epoch s, psutil), None without psutil: told apart from a later one of the same pid."""
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except ImportError:
        return None
