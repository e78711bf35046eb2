"""The faults an adversarial probe still got through (issue 43), each run as the probe ran it: the
command, its exit status, its one line, and what is (not) in the store or cache afterwards.

S below is the probe's sweep, `python -m sweeps.run main profile=smoke ...` with its own store and
run folder; where a case does not need real rows it runs the smallest sweep (fault_helpers.SWEEP)
with a fake runner instead of training.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fault_helpers import errors
from sweeps.run import main
from sweeps.spec import EXPERIMENTS_DIR


def probe_args(tmp_path: Path, *args: str) -> list[str]:
    """The probe's own store and run folder (neither may exist after a refused command)."""
    return [*args, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--run-dir", str(tmp_path / "run"),
            "--workers", "1", "--threads", "1", "--quiet"]


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# 8. Unclear messages


def test_a_search_of_no_trials_names_n_trials_and_the_command_line(tmp_path: Path, capsys) -> None:
    assert main(probe_args(tmp_path, "search_loss", "search.n_trials=0")) == 2
    assert errors(capsys.readouterr().err) == [
        "error: command line: bad value at key 'search.n_trials': 0; expected an integer >= 1 "
        "(the search's trials are this sweep's only rows)"]
    assert nothing_written(tmp_path)


def test_a_broken_override_value_says_what_was_expected(tmp_path: Path, capsys) -> None:
    assert main(probe_args(tmp_path, "main", "profile=smoke", "reader.layers=[30,")) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: override 'reader.layers=[30,': the value '[30,' is not valid YAML (")
    assert line.endswith("expected KEY=VALUE with a YAML value, e.g. reader.rank=16 or reader.layers=[30,62]")
    assert nothing_written(tmp_path)


def test_an_empty_spec_file_is_listed_as_broken_not_as_a_search(tmp_path: Path, capsys) -> None:
    import shutil

    experiments = Path(shutil.copytree(EXPERIMENTS_DIR, tmp_path / "experiments"))
    (experiments / "empty.yaml").write_text("")
    assert main(["--list", "--experiments-dir", str(experiments)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("empty ")]
    assert line.split(None, 1)[1] == ("BROKEN empty.yaml: the file is empty; expected a 'grid', 'variants' or "
                                      "'search' section")
    assert main(["empty", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: {experiments / 'empty.yaml'}: declares no rows; expected a 'grid', 'variants' or 'search' section"]


@pytest.mark.parametrize("override, shown", [
    ("reader.rank=0", "0"),  # the probe's case: it was blamed on experiments/main.yaml
    ("eval.top_p=0", "0.0"),
])
def test_a_command_line_value_that_fails_validation_is_blamed_on_the_command_line(
        override: str, shown: str, tmp_path: Path, capsys) -> None:
    assert main(probe_args(tmp_path, "main", "profile=smoke", override)) == 2
    (line,) = errors(capsys.readouterr().err)
    key = override.split("=")[0]
    assert line.startswith(f"error: command line: bad value at key '{key}': {shown}; expected ")
    assert nothing_written(tmp_path)


def test_a_bad_value_in_a_spec_file_is_still_blamed_on_that_file(tmp_path: Path, capsys) -> None:
    import shutil

    experiments = Path(shutil.copytree(EXPERIMENTS_DIR, tmp_path / "experiments"))
    spec = experiments / "main.yaml"
    spec.write_text(spec.read_text() + "config: {reader: {rank: 0}}\n")
    profile = experiments / "profiles" / "smoke.yaml"
    assert main(["main", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"error: {spec}: bad value at key 'reader.rank': 0; expected ")
    profile.write_text(profile.read_text().replace("  reader: {mlp_hidden: 32}", "  reader: {mlp_hidden: 32, rank: -1}"))
    assert main(["main", "profile=smoke", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"error: {profile}: bad value at key 'reader.rank': -1; expected ")
