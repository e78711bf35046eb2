"""sweeps.launch: one sweep row's config for sweeps.commands.train_launch, resolved as `python -m sweeps.run` resolves it."""

from __future__ import annotations

import pytest

from sweeps.commands.train_launch import LaunchError
from sweeps.launch import main, sweep_row_config
from sweeps.spec import load_sweep


def test_a_row_and_seed_resolve_to_the_config_the_sweep_runs():
    job = load_sweep("rank", ["profile=smoke"]).jobs()[-1]
    cfg = sweep_row_config("rank", job.variant.label, job.seed, ["profile=smoke"])
    assert cfg == job.cfg


def test_an_unknown_row_is_one_line_naming_the_labels(capsys):
    with pytest.raises(LaunchError, match=r"--row 'r=999' --seed None: no such row in sweep 'rank'; expected a label of"):
        sweep_row_config("rank", "r=999", None, [])
    assert main(["--sweep", "rank", "--row", "r=999"]) == 2
    assert capsys.readouterr().err.startswith("error: --row 'r=999'")
    assert main(["--sweep", "rank"]) == 2  # no --row
    assert "--sweep needs --row LABEL" in capsys.readouterr().err
