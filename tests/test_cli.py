"""`ready COMMAND ...` (sweeps/cli.py) is `python -m MODULE ...`: every entry point has a command, the
arguments and the exit status pass through unchanged, bad input is one line, and `ready --help` needs
no torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from sweeps import cli

ROOT = Path(__file__).resolve().parent.parent


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _ready(*args: str) -> subprocess.CompletedProcess:
    return _python("-m", "sweeps.cli", *args)


def _modules_with(folder: Path, test) -> set[str]:
    out = set()
    for path in folder.rglob("*.py"):
        if "__pycache__" not in path.parts and test(ast.parse(path.read_text())):
            out.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return out


def _has_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def _runs_as_main(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def test_every_bench_and_diagnostics_module_with_a_main_is_a_command():
    table = cli.table()
    for group, folder in (("bench", "benchmarks"), ("diagnose", "benchmarks/diagnostics")):
        # the group's own modules: benchmarks/diagnostics/ is a group of its own, not `ready bench diagnostics`
        want = {m.rsplit(".", 1)[1] for m in _modules_with(ROOT / folder, _has_main)
                if m.rsplit(".", 1)[0] == folder.replace("/", ".")}
        got = {line.split(" ", 1)[1] for line in table if line.startswith(group + " ")}
        assert got == want, f"ready {group}: commands {sorted(got)}, modules with a main {sorted(want)}"
    assert "bench diagnostics" not in table and "bench context_ceiling" not in table
    assert table["bench engine"] == "benchmarks.engine"
    assert table["diagnose context_ceiling"] == "benchmarks.diagnostics.context_ceiling"


def test_every_python_m_entry_point_is_a_command_or_said_why_not():
    entry_points = set().union(*(_modules_with(ROOT / top, _runs_as_main) for top in ("ready", "benchmarks", "sweeps", "reports")))
    commands = set(cli.table().values())
    missing = entry_points - commands - set(cli.NOT_COMMANDS)
    assert not missing, f"give {sorted(missing)} a command in sweeps/cli.py (COMMANDS) or a reason in NOT_COMMANDS"
    assert not (commands & set(cli.NOT_COMMANDS))
    for module in commands:  # each takes the rest of the command line as main(argv)
        main = next(n for n in ast.parse(cli.source(module).read_text()).body
                    if isinstance(n, ast.FunctionDef) and n.name == "main")
        assert main.args.args, f"{module}.main takes no argv"


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ready": "sweeps.cli:main"}


def test_help_lists_every_command_without_importing_torch():
    code = ("import sys; from sweeps.cli import main; rc = main(['--help']); "
            "rc |= main(['bench', '--help']) | main(['diagnose', '--help']); "
            "heavy = sorted(m for m in ('torch', 'omegaconf', 'mlflow', 'polars', 'benchmarks.engine') "
            "if m in sys.modules); print('IMPORTED', heavy, rc)")
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "IMPORTED [] 0"
    for line, module in cli.table().items():
        name = line.split(" ")[-1]
        assert any(row.split()[:2] == [name, module] for row in out.stdout.splitlines()), (line, module)
    assert "Train and evaluate every row of a sweep." in out.stdout


def test_ready_sweep_list_is_python_m_sweeps_run_list():
    ready, plain = _ready("sweep", "--list"), _python("-m", "sweeps.run", "--list")
    assert ready.returncode == plain.returncode == 0, ready.stderr + plain.stderr
    assert ready.stdout == plain.stdout and "rank" in ready.stdout


@pytest.mark.parametrize("args, where", [(["nope"], "ready"), (["bench", "nope"], "ready bench"),
                                         (["diagnose", "nope"], "ready diagnose")])
def test_an_unknown_command_is_one_line_and_exit_2(args, where, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1
    assert err.err.startswith(f"{where}: unknown command 'nope'; expected one of: ")
    if where == "ready":
        assert "sweep, report," in err.err and "bench, diagnose" in err.err


def test_an_unknown_command_from_the_shell(tmp_path):
    out = _ready("swep", "rank")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "'swep'" in out.stderr


def test_no_command_prints_the_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: ready COMMAND" in capsys.readouterr().err


def test_a_command_passes_its_arguments_prog_and_exit_status_through(monkeypatch):
    seen = {}

    def main(argv):
        seen.update(argv=argv, prog=sys.argv[0], rest=sys.argv[1:])
        return 3

    monkeypatch.setitem(sys.modules, "fake_entry", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.COMMANDS, "fake-entry", "fake_entry")
    before = list(sys.argv)
    assert cli.main(["fake_entry", "rank", "--dry-run", "a.b=1"]) == 3  # `_` and `-` both name it
    assert seen == {"argv": ["rank", "--dry-run", "a.b=1"], "prog": "ready fake-entry",
                    "rest": ["rank", "--dry-run", "a.b=1"]}
    assert sys.argv == before


@pytest.mark.parametrize("result, status", [(None, 0), (0, 0), (2, 2), ({"rows": 1}, 0), ([], 0), (True, 1)])
def test_the_exit_status_is_what_python_m_would_give(result, status):
    assert cli.exit_status(types.SimpleNamespace(), result) == status


def test_a_module_s_own_exit_status_wins():
    from benchmarks.diagnostics import induction_toy

    assert cli.exit_status(induction_toy, []) == 1 and cli.exit_status(induction_toy, [{"step": 1}]) == 0


def test_smoke_switches_the_triton_interpreter_on_through_ready_too():
    code = ("import os, sys; os.environ.pop('TRITON_INTERPRET', None); from sweeps.cli import main\n"
            "try:\n    main(['bench', 'kernels', '--smoke', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('INTERPRET', os.environ.get('TRITON_INTERPRET'))")
    out = _python("-c", code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "INTERPRET 1"
    assert "usage: ready bench kernels" in out.stdout


@pytest.mark.parametrize("command", [["generate", "--target", "tiny", "--method", "ar", "--prompt-ids", "1,2"],
                                     ["bench", "engine", "--target", "tiny"],
                                     ["bench", "train_scale", "--target", "tiny", "--quick"],
                                     ["bench", "step_trace", "--draft", "dspark"],
                                     ["bench", "exact", "--probe"],
                                     ["bench", "target", "--preset", "tiny"]])
def test_a_misspelled_config_key_is_the_line_ready_sweep_gives(command):
    """`ready generate` and the benchmarks take the typed config's `a.b=v` as `ready sweep` does: the
    same parser, so a misspelled key is the same one line and exit status 2; `--help` shows the overrides."""
    sweep = _ready("sweep", "rank", "--dry-run", "drafter.proposal=6")
    out = _ready(*command, "drafter.proposal=6")
    assert sweep.returncode == out.returncode == 2 and out.stdout == ""
    assert out.stderr == sweep.stderr == ("error: command line: bad value at key 'drafter.proposal': Key 'proposal' "
                                          "not in 'DrafterConfig'. Did you mean one of: 'proposals', 'rope_scaling'?\n")
    shown = _ready(*command[:2 if command[0] == "bench" else 1], "--help")
    assert shown.returncode == 0 and "KEY=VALUE" in shown.stdout and "overrides of the typed config" in shown.stdout
