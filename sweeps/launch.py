"""`torchrun ... -m sweeps.launch --sweep NAME --row LABEL`: one sweep row's training, data-parallel.

    torchrun ... -m sweeps.launch --sweep rank --row "r=8" --seed 0 [a.b=v]   # one sweep row's config
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29500 \\
        --rdzv-id r8 -m sweeps.launch --sweep rank --row "r=8" ...           # two hosts (docs/sweeps.md)

The row's resolved config is the one `python -m sweeps.run NAME` runs (overrides go to the sweep);
the training and every other option (`--what`, `--out-dir`, `--json`, ...) are `sweeps.commands.train_launch`'s.
The sweep's spec lives above the library, so this command does too.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from omegaconf import DictConfig

from ready.config import entry_point
from sweeps.commands import train_launch
from sweeps.spec import load_sweep
from sweeps.torchrun import LaunchError


def sweep_row_config(sweep: str, row: str, seed: Optional[int], overrides: Sequence[str]) -> DictConfig:
    """The resolved config of one row (label) and seed of a sweep, as `python -m sweeps.run` runs it."""
    jobs = load_sweep(sweep, list(overrides)).jobs()
    match = [j for j in jobs if j.variant.label == row and (seed is None or j.seed == seed)]
    if not match:
        labels = ", ".join(repr(x) for x in dict.fromkeys(j.variant.label for j in jobs))
        seeds = sorted({j.seed for j in jobs})
        raise LaunchError(f"--row {row!r} --seed {seed}: no such row in sweep {sweep!r}; expected a label of "
                          f"{labels} and a seed in {seeds}")
    return match[0].cfg


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the launcher's options plus `--sweep/--row/--seed` and train that row (sweeps.commands.train_launch.run)."""
    p = train_launch.parser(prog="python -m sweeps.launch", description=__doc__.split("\n")[0])
    p.add_argument("--sweep", required=True, help="take the config of one sweep row (with --row, --seed)")
    p.add_argument("--row", default=None, help="the row's label, as in `python -m sweeps.run NAME --dry-run`")
    p.add_argument("--seed", type=int, default=None, help="the row's seed (default: its first)")
    args = p.parse_args(argv)

    def config() -> DictConfig:
        if not args.row:
            raise LaunchError("--sweep needs --row LABEL (python -m sweeps.run NAME --dry-run lists the labels)")
        return sweep_row_config(args.sweep, args.row, args.seed, args.overrides)

    return train_launch.run(args, config)


if __name__ == "__main__":
    sys.exit(main())
