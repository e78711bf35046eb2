"""Build (or find in the cache) the embedded default target and print its metrics as JSON.

    python -m sweeps.commands.build_data             # the default config
    python -m sweeps.commands.build_data pretrain.steps=100 artifacts_dir=/tmp/art threads.shared=1

Prints one JSON object: the target folder, whether it was a cache hit, the wall time of this
call, and the build's metrics.json (held-out loss, train time, tokens seen, a greedy sample). The build
runs on `threads.shared` torch threads, which its hash includes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


from ready.config import entry_point, load_config
from ready.data.default import default_metrics, default_target_dir, ensure_default_target


@entry_point
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="config overrides a.b=v")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    cfg = load_config(overrides=args.overrides)
    hit = (default_target_dir(cfg) / "DONE").is_file()
    t0 = time.perf_counter()
    out = ensure_default_target(cfg, progress=not args.quiet)
    report = {"target_dir": str(out), "cache_hit": hit, "wall_s": time.perf_counter() - t0,
              **default_metrics(out)}
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
