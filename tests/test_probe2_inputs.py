"""The second adversarial probe's input, spec, store and command-line faults (issue 75, items 3 and 6-11),
each run as the probe ran it: the command, its exit status, its one line, and that nothing ran, was
written, lost or duplicated.

Sweep cases that need no real rows run the smallest sweep (fault_helpers.SWEEP) with a fake runner.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fault_helpers import errors

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# 11. Honest lower bounds: omegaconf>=2.3 while the code called a 2.4-only keyword


def test_the_config_loads_with_omegaconf_2_3s_resolver_api(monkeypatch) -> None:
    """omegaconf 2.3's `register_resolver` is its legacy API (no keywords, no nested interpolations) and
    `register_new_resolver` the one that takes `${drafter.num_layers}`; pyproject allows 2.3, so the
    config must load there. Stand-ins with 2.3's signatures replace 2.4's for the registration."""
    from omegaconf import OmegaConf

    import ready.config as config

    used = []

    def legacy_register_resolver(name, resolver):  # 2.3's signature: an unknown keyword is a TypeError
        raise AssertionError("2.3's legacy register_resolver refuses nested interpolations")

    def register_new_resolver(name, resolver, *, replace=False, use_cache=False):
        used.append(name)
        real(name, resolver, replace=replace, use_cache=use_cache)

    real = OmegaConf.register_resolver
    OmegaConf.clear_resolver("ready_range")
    monkeypatch.setattr(OmegaConf, "register_resolver", legacy_register_resolver)
    monkeypatch.setattr(OmegaConf, "register_new_resolver", register_new_resolver, raising=False)
    try:
        config._register_resolvers()
    finally:
        monkeypatch.undo()
        if not OmegaConf.has_resolver("ready_range"):
            config._register_resolvers()
    assert used == ["ready_range"]
    cfg = config.load_config(overrides=["drafter.num_layers=3", "reader.inject_layers=${ready_range:${drafter.num_layers}}"])
    assert list(cfg.reader.inject_layers) == [0, 1, 2]


def test_pyproject_states_the_omegaconf_bound_the_test_above_checks() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "omegaconf>=2.3" in deps


# ---------------------------------------------------------------------------------------------
# 9. One rule for config errors on every entry point: one line, exit 2, the key's full path

# owned by another branch (issue 75, items 2, 4, 5, 9's checkpoint part): `ready generate` and `ready export` get
# the rule from the dispatcher (sweeps/cli.py applies it to every command it runs) until their mains carry it
NOT_YET_DECORATED: set[str] = set()


def test_every_command_s_main_carries_the_config_error_rule() -> None:
    import ast

    from sweeps import cli

    missing = []
    for module in sorted(set(cli.table().values()) - NOT_YET_DECORATED):
        main = next(n for n in ast.parse(cli.source(module).read_text()).body
                    if isinstance(n, ast.FunctionDef) and n.name == "main")
        if not any(ast.unparse(d) == "entry_point" for d in main.decorator_list):
            missing.append(module)
    assert not missing, f"decorate main() with ready.config.entry_point in {missing}"


def exits_2_with_one_line(capsys, argv: list[str]) -> str:
    """`ready ARGV` in this process: exit status 2 and one `error:` line, nothing on stdout."""
    from sweeps import cli

    try:
        code = cli.main(argv)  # a command that catches its own user errors returns 2
    except SystemExit as ended:  # the others: the rule (ready.config.entry_point) exits 2
        code = ended.code
    assert code == 2
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = errors(out.err)
    return line


def test_the_dispatcher_applies_the_rule_to_a_command_without_it(monkeypatch, capsys) -> None:
    import types

    from ready.config import ConfigError
    from sweeps import cli

    def main(argv):
        raise ConfigError("command line: bad value at key 'reader.rnak': Key 'rnak' not in 'ReaderConfig'")

    monkeypatch.setitem(__import__("sys").modules, "fake_entry", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.COMMANDS, "fake-entry", "fake_entry")
    line = exits_2_with_one_line(capsys, ["fake-entry", "reader.rnak=8"])
    assert line == "error: command line: bad value at key 'reader.rnak': Key 'rnak' not in 'ReaderConfig'"


@pytest.mark.parametrize("argv, line", [
    (["build-data", "reader.rnak=8"],
     "error: command line: bad value at key 'reader.rnak': Key 'rnak' not in 'ReaderConfig'. Did you mean: 'rank'?"),
    (["build-data", "threads.shared=abc"], "error: command line: bad value at key 'threads.shared': 'abc'; expected an integer"),
    (["diagnose", "context_ceiling", "reader.rnak=3"],
     "error: command line: bad value at key 'reader.rnak': Key 'rnak' not in 'ReaderConfig'. Did you mean: 'rank'?"),
    (["diagnose", "plateau", "eval.top_p=x"], "error: command line: bad value at key 'eval.top_p': 'x'; expected a number"),
    (["launch", "threads.drafters=0"], "error: command line: bad value at key 'threads.drafters': 0; expected an integer >= 1 "
                                       "(torch CPU threads of drafter training and evaluation)"),
])
def test_a_ready_command_with_a_bad_key_is_one_line_and_exit_2(argv: list[str], line: str, tmp_path: Path, monkeypatch,
                                                                 capsys) -> None:
    monkeypatch.chdir(tmp_path)  # the default artifacts_dir is ./artifacts: nothing may appear there
    assert exits_2_with_one_line(capsys, argv) == line
    assert list(tmp_path.iterdir()) == []


def test_python_m_applies_the_same_rule(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "sweeps.commands.build_data", "reader.rnak=8"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert errors(out.stderr) == ["error: command line: bad value at key 'reader.rnak': Key 'rnak' not in "
                                  "'ReaderConfig'. Did you mean: 'rank'?"]
    assert list(tmp_path.iterdir()) == []


def test_a_drafter_checkpoint_that_is_no_dspark_folder_is_one_line_even_in_a_dry_run(tmp_path: Path, capsys) -> None:
    from sweeps.run import main

    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    (folder / "notes.txt").write_text("weights elsewhere")
    code = main(["main", "preset=local_checkpoint_template", f"drafter.checkpoint={folder}", "--dry-run"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert errors(out.err) == [f"error: command line: bad value at key 'drafter.checkpoint': {str(folder)!r} is not a "
                               "drafter folder; expected a DSpark folder (config.json with dflash_config + model.safetensors)"]
    assert main(["main", "preset=local_checkpoint_template", "--dry-run"]) == 2  # the template's placeholder path
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"error: {REPO / 'experiments' / 'presets' / 'local_checkpoint_template.yaml'}: bad value "
                           "at key 'drafter.checkpoint': '/path/to/dspark_drafter_dir' is not a drafter folder")


def probe_args(tmp_path: Path, *args: str) -> list[str]:
    """`sweeps.run` arguments with the probe's own store and run folder (neither may exist after a refusal)."""
    return [*args, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--run-dir", str(tmp_path / "run"),
            "--workers", "1", "--quiet", "--no-report", "--runner", "fault_helpers:nan_run_variant"]


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, line", [
    ("train.stage1.grad_clip=0", "bad value at key 'train.stage1.grad_clip': 0.0; expected a positive number (the "
                                 "gradient norm's bound)"),
    ("pretrain.warmup=2", "bad value at key 'pretrain.warmup': 2.0; expected a share of the steps in [0, 1]"),
    ("train.lora.dropout=1", "bad value at key 'train.lora.dropout': 1.0; expected a share in [0, 1)"),
    ("regen.seed=-1", "bad value at key 'regen.seed': -1; expected an integer seed in [0, 4294967295]"),
    ("reader.layer_space=gdn", "bad value at key 'reader.layer_space': 'gdn'; expected paper or model"),
])
def test_a_value_out_of_its_range_is_refused_at_load(override: str, line: str, tmp_path: Path, capsys) -> None:
    from sweeps.run import main

    assert main(probe_args(tmp_path, "inject_pos", "profile=smoke", override)) == 2
    assert errors(capsys.readouterr().err) == [f"error: command line: {line}"]
    assert nothing_written(tmp_path)


# ---------------------------------------------------------------------------------------------
# 7. Specs: an empty grid, a suite named twice, a sweep name that is a path


def test_an_empty_grid_is_refused_not_one_row_labelled_r(tmp_path: Path, capsys) -> None:
    import shutil

    from sweeps.run import main
    from sweeps.spec import EXPERIMENTS_DIR

    experiments = Path(shutil.copytree(EXPERIMENTS_DIR, tmp_path / "experiments"))
    spec = experiments / "empty_grid.yaml"
    spec.write_text("table: table3\ngrid:\n  values: {}\n  label: r\n")
    assert main(["empty_grid", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and errors(out.err) == [
        f"error: {spec}: bad value at key 'grid.values': empty; expected at least one config key with a non-empty list "
        "of values to sweep (e.g. reader.rank: [8, 16])"]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_suite_named_twice_is_refused(dry_run: bool, tmp_path: Path, capsys) -> None:
    from sweeps.run import main

    args = probe_args(tmp_path, "inject_pos", "profile=smoke", "bench.suites=[humaneval,humaneval]")
    assert main(args + (["--dry-run"] if dry_run else [])) == 2
    assert errors(capsys.readouterr().err) == [
        "error: command line: bad value at key 'bench.suites': ['humaneval', 'humaneval']; expected each benchmark "
        "once (a suite named twice would be decoded and pooled twice)"]
    assert nothing_written(tmp_path)


def test_a_sweep_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch, capsys) -> None:
    from sweeps.run import main

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # runs/../experiments/inject_pos would be tmp_path/work/experiments/...
    assert main(["../experiments/inject_pos", "profile=smoke", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                 "--workers", "1", "--quiet", "--no-report", "--runner", "fault_helpers:nan_run_variant"]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: sweep '../experiments/inject_pos': a sweep name is a name, not a path; expected one "
                           "of ['ft_control', ")
    assert list(tmp_path.iterdir()) == [tmp_path / "work"] and list((tmp_path / "work").iterdir()) == []
    assert not (REPO / "experiments" / "inject_pos").exists()


# ---------------------------------------------------------------------------------------------
# 10. Seeds beyond what the generators take


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_seed_of_2_to_the_64_is_refused_at_load_with_the_range(dry_run: bool, tmp_path: Path, capsys) -> None:
    from sweeps.run import main

    args = probe_args(tmp_path, "inject_pos", "profile=smoke", f"seeds=[{2 ** 64}]")
    assert main(args + (["--dry-run"] if dry_run else [])) == 2
    out = capsys.readouterr()
    assert out.out == "" and errors(out.err) == [
        "error: command line: bad value at key 'seeds': 18446744073709551616; expected integer seeds in [0, 4294967295]"]
    assert nothing_written(tmp_path)


# ---------------------------------------------------------------------------------------------
# 10. A journal cut mid-record; an Optuna journal that is a folder


def fake_sweep(tmp_path: Path, *extra: str) -> list[str]:
    """`sweeps.run` of the smallest sweep, one seed, the fake runner (FINISHED rows), its own store and run folder."""
    return ["inject_pos", "profile=smoke", "seeds=[0]", "--runner", "test_sweeps_fake_runner", "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}", "--run-dir", str(tmp_path / "run"), "--workers", "1", "--quiet",
            "--no-report", *extra]


def started_rows(log: Path) -> list[str]:
    import json

    return [json.loads(x)["hash"] for x in log.read_text().splitlines() if json.loads(x)["event"] == "start"]


@pytest.fixture
def row_log(tmp_path: Path, monkeypatch) -> Path:
    """The fake runner's log of the rows it ran; the working directory is tmp_path (MLflow's ./mlruns goes there)."""
    log = tmp_path / "calls.jsonl"
    log.touch()
    monkeypatch.setenv("FAKE_RUN_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    return log


def test_a_journal_cut_mid_record_is_healed_by_the_next_runs(tmp_path: Path, row_log: Path, capsys) -> None:
    """A crash in the middle of an append leaves a record without its line end; the next append used to glue
    its record to it, and every run after that failed on `Expecting ':' delimiter: line 1 column 141`."""
    import os

    from sweeps.run import main

    assert main(fake_sweep(tmp_path)) == 0
    assert len(started_rows(row_log)) == 6
    journal = tmp_path / "run" / "optuna.journal"
    os.truncate(journal, journal.stat().st_size - 40)  # the last record, cut
    capsys.readouterr()
    assert main(fake_sweep(tmp_path)) == 0  # every row finished: skipped, and one record appended
    err = capsys.readouterr().err
    assert "Traceback" not in err and errors(err) == []
    (torn,) = [ln for ln in err.splitlines() if "torn" in ln]
    assert torn.startswith(f"[sweeps] {journal}: dropped a torn last record (") and torn.endswith(
        " bytes without their line end: a crash while it was written)")
    assert main(fake_sweep(tmp_path)) == 0  # and the run after that reads the journal as well
    assert "torn" not in capsys.readouterr().err
    assert journal.read_bytes().endswith(b"\n")
    assert sorted(started_rows(row_log)) == sorted(set(started_rows(row_log))) and len(started_rows(row_log)) == 6


def test_a_journal_damaged_inside_is_one_line_naming_the_file_and_what_to_do(tmp_path: Path, row_log: Path,
                                                                              capsys) -> None:
    from sweeps.run import main

    assert main(fake_sweep(tmp_path, "--dry-run")) == 0
    assert main(fake_sweep(tmp_path)) == 0
    journal = tmp_path / "run" / "optuna.journal"
    lines = journal.read_bytes().split(b"\n")
    lines[3] = lines[3][:50] + lines[4]  # a torn record with the next one glued to it (as before the fix)
    del lines[4]
    journal.write_bytes(b"\n".join(lines))
    capsys.readouterr()
    assert main(fake_sweep(tmp_path)) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: Optuna journal {journal}: line 4 is not a complete record (a crash while it was written, or an edit); "
        "expected one JSON record per line: move the file aside (the queue is rebuilt on the next run, and rows MLflow "
        "holds as finished are skipped)"]
    journal.rename(journal.with_name("optuna.journal.damaged"))  # what the line says to do
    assert main(fake_sweep(tmp_path)) == 0
    assert len(started_rows(row_log)) == 6  # nothing ran twice


def test_an_optuna_journal_that_is_a_folder_is_one_line(tmp_path: Path, capsys) -> None:
    from sweeps.run import main

    (tmp_path / "run" / "optuna.journal").mkdir(parents=True)
    assert main(fake_sweep(tmp_path)) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: Optuna journal {tmp_path / 'run' / 'optuna.journal'}: is a folder; expected the run folder's journal "
        "file (move the folder aside, or pass another --run-dir)"]


# ---------------------------------------------------------------------------------------------
# 8. PostgreSQL URLs as the docs write them; an unreachable store answers within seconds


def test_postgresql_urls_in_the_documented_form_work_for_the_queue_and_the_store(tmp_path: Path, row_log: Path,
                                                                                  monkeypatch) -> None:
    from fault_helpers import postgres_server
    from sweeps import tracking
    from sweeps.run import main

    with postgres_server(("optuna", "mlflow")) as urls:
        assert urls["optuna"].startswith("postgresql://") and urls["mlflow"].startswith("postgresql://")
        args = ["inject_pos", "profile=smoke", "seeds=[0]", "--runner", "test_sweeps_fake_runner", "--storage",
                urls["optuna"], "--tracking-uri", urls["mlflow"], "--run-dir", str(tmp_path / "run"), "--workers", "1",
                "--quiet", "--no-report"]
        assert main(args) == 0
        assert main(args) == 0  # every row found finished in the PostgreSQL store: nothing runs twice
        c = tracking.client(tracking.resolve_tracking_uri(urls["mlflow"]))
        exp = c.get_experiment_by_name("ready-inject_pos")
        runs = c.search_runs([exp.experiment_id], "tags.`ready.kind` = 'variant'")
    assert len(runs) == 6 and {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(started_rows(row_log)) == sorted(r.data.tags["ready.config_hash"] for r in runs)
    assert not (tmp_path / "run" / "optuna.journal").exists()


@pytest.mark.parametrize("flag", ["--tracking-uri", "--storage"])
def test_an_unreachable_postgresql_server_is_one_line_before_any_retry(flag: str, tmp_path: Path, monkeypatch,
                                                                        capsys) -> None:
    """MLflow retries its first connection for about 100 s (its engine's retry loop): the store is asked once,
    with a connect timeout of seconds, before MLflow or Optuna is given the URL."""
    import mlflow.store.db.utils

    from sweeps.run import main

    real = mlflow.store.db.utils.create_sqlalchemy_engine_with_retry

    def retrying(uri):
        if uri.startswith("sqlite"):  # the sweep's own store (--storage's case)
            return real(uri)
        raise AssertionError("MLflow's retrying connection was reached")

    monkeypatch.setattr(mlflow.store.db.utils, "create_sqlalchemy_engine_with_retry", retrying)
    url = f"postgresql://ready:secret@127.0.0.1:1/{'mlflow' if flag == '--tracking-uri' else 'optuna'}"
    assert main(fake_sweep(tmp_path, flag, url)) == 2
    (line,) = errors(capsys.readouterr().err)
    if flag == "--tracking-uri":
        assert line.startswith("error: tracking URI 'postgresql+psycopg2://ready:***@127.0.0.1:1/mlflow': cannot connect (")
        assert line.endswith("); expected a reachable database (postgresql://USER:PW@HOST:5432/DB) or a sqlite:/// path")
    else:
        assert line.startswith("error: --storage 'postgresql://ready:***@127.0.0.1:1/optuna': cannot connect (")
        assert line.endswith("); expected a reachable database URL such as postgresql://user@host:5432/optuna")
    assert "Connection refused" in line and "secret" not in line


# ---------------------------------------------------------------------------------------------
# 6 and 9. Reports on a missing, mistyped or newer store; --out under a file


FINDINGS_MD = "# My reading\n\nhand-written\n\n{marker}\n\n## generated tables\n"


@pytest.fixture
def findings_md(tmp_path: Path) -> Path:
    from reports.findings import MARKER

    path = tmp_path / "findings.md"
    path.write_text(FINDINGS_MD.format(marker=MARKER))
    return path


@pytest.mark.parametrize("uri, why", [
    ("sqlite:///{tmp}/mlfow.db", "no MLflow database at {tmp}/mlfow.db; expected the store a sweep wrote (run "
                                 "`python -m sweeps.run NAME` first or pass --tracking-uri)"),
    ("sqlit:///{tmp}/mlflow.db", "unknown scheme 'sqlit'; expected sqlite:///PATH (e.g. sqlite:///mlflow.db), "
                                 "http(s)://HOST:PORT (an MLflow server) or postgresql://USER@HOST:5432/DB"),
])
def test_findings_on_a_missing_or_mistyped_store_is_one_line_and_keeps_the_file(uri: str, why: str, tmp_path: Path,
                                                                                  findings_md: Path, monkeypatch,
                                                                                  capsys) -> None:
    from reports.findings import main as findings

    monkeypatch.chdir(tmp_path)
    uri, why = uri.format(tmp=tmp_path), why.format(tmp=tmp_path)
    before = findings_md.read_bytes()
    assert findings(["--tracking-uri", uri, "--out", str(findings_md)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and errors(out.err) == [f"error: tracking URI {uri!r}: {why}"]
    assert findings_md.read_bytes() == before  # its generated part was replaced by "not run" verdicts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["findings.md"]  # no store, no mlruns/ made


def test_findings_on_a_store_without_the_sweeps_is_one_line(base: Path, tmp_path: Path, findings_md: Path,
                                                            capsys) -> None:
    from fault_helpers import store_copy
    from reports.findings import main as findings

    uri = store_copy(base, tmp_path / "store")  # an MLflow store of other experiments
    before = findings_md.read_bytes()
    assert findings(["--tracking-uri", uri, "--out", str(findings_md)]) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: tracking URI {uri!r}: none of the findings' sweeps (ft_control, inject_layer, inject_pos, layers, "
        "positive_control, rank) is there; expected the store the sweeps wrote (run `python -m sweeps.run NAME` first)"]
    assert findings_md.read_bytes() == before


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp()


def test_reports_build_out_under_a_file_is_one_line(base: Path, tmp_path: Path, capsys) -> None:
    from fault_helpers import store_copy
    from reports.build import main as build

    uri = store_copy(base, tmp_path / "store")
    (tmp_path / "notes.txt").write_text("mine")
    assert build(["--tracking-uri", uri, "--out", str(tmp_path / "notes.txt" / "tables")]) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: --out {tmp_path / 'notes.txt' / 'tables'}: {tmp_path / 'notes.txt'} is a file, so no folder can be "
        "made under it; expected a folder for the reports"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("uri, why", [
    ("sqlit:///{tmp}/mlflow.db", "unknown scheme 'sqlit'"),
    ("sqlite//{tmp}/mlflow.db", "not a URI (no scheme)"),
    ("sqlite:/{tmp}/mlflow.db", "a sqlite URI takes three slashes before a relative path and four before an absolute one"),
    ("htp://localhost:5000", "unknown scheme 'htp'"),
])
def test_a_tracking_uri_with_a_mistyped_scheme_is_one_line_everywhere(uri: str, why: str, tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    from reports.build import main as build
    from reports.findings import main as findings
    from sweeps.run import main

    monkeypatch.chdir(tmp_path)
    uri = uri.format(tmp=tmp_path)
    expected = (f"error: tracking URI {uri!r}: {why}; expected sqlite:///PATH (e.g. sqlite:///mlflow.db), http(s)://"
                "HOST:PORT (an MLflow server) or postgresql://USER@HOST:5432/DB")
    assert main(["inject_pos", "profile=smoke", "--tracking-uri", uri, "--run-dir", str(tmp_path / "run"), "--workers",
                 "1", "--quiet", "--no-report", "--runner", "fault_helpers:nan_run_variant"]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert build(["--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert findings(["--tracking-uri", uri]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and list((tmp_path / "run").iterdir()) == []


def test_a_store_written_by_a_newer_mlflow_is_one_line_and_left_as_it_is(base: Path, tmp_path: Path, capsys) -> None:
    import sqlite3

    import mlflow

    from fault_helpers import store_copy
    from reports.build import main as build
    from reports.findings import main as findings
    from sweeps.run import main

    uri = store_copy(base, tmp_path / "store")
    db = tmp_path / "store" / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("update alembic_version set version_num = 'f00dfacef00d'")
    con.close()
    before = db.read_bytes()
    expected = (f"error: tracking URI {uri!r}: {db} was written by a newer MLflow (schema revision f00dfacef00d, unknown "
                f"to MLflow {mlflow.__version__} here; left as it is); expected a store this MLflow reads: upgrade MLflow "
                "here (pip install -U mlflow), or use another store")
    assert main(["inject_pos", "profile=smoke", "--tracking-uri", uri, "--run-dir", str(tmp_path / "run"), "--workers",
                 "1", "--quiet", "--no-report", "--runner", "fault_helpers:nan_run_variant"]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert build(["--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert findings(["--tracking-uri", uri]) == 2
    assert errors(capsys.readouterr().err) == [expected]
    assert db.read_bytes() == before and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 3. data.on_error=skip skips rows, not files; parsing is bounded in depth and size

GOOD_ROW = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}


def jsonl_with(tmp_path: Path, bad: bytes, name: str = "chats.jsonl", good: int = 200) -> Path:
    """`good` good rows, the bad line as row 101 (line 101)."""
    import json

    lines = [json.dumps(GOOD_ROW).encode()] * good
    lines.insert(100, bad)
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def not_utf8_row() -> bytes:
    return b'{"conversations": [{"from": "human", "value": "caf\xe9"}, {"from": "gpt", "value": "x"}]}'


def deep_row(depth: int = 200_000) -> bytes:
    return b'{"conversations": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("bad, reason, line", [
    (not_utf8_row(), "not_utf8", "row 101 (line 101): not UTF-8 text (byte 51 of the line is 0xe9); expected UTF-8 JSON"),
    (deep_row(), "too_deep", "row 101 (line 101): values nested more than 32 deep; expected a conversation row (an "
                             "object of turns, a few levels deep)"),
    (deep_row(40), "too_deep", "row 101 (line 101): values nested more than 32 deep; expected a conversation row (an "
                               "object of turns, a few levels deep)"),
])
def test_one_bad_jsonl_row_is_one_skipped_row_or_one_line(bad: bytes, reason: str, line: str, tmp_path: Path) -> None:
    from ready.data.conversations import ConversationError, load_conversations

    path = jsonl_with(tmp_path, bad)
    convs, report = load_conversations(path, on_error="skip")
    assert len(convs) == 200 and [c.row for c in convs] == [*range(1, 101), *range(102, 202)]
    metrics = report.metrics()
    assert metrics["data/rows_skipped"] == 1 and metrics["data/files_skipped"] == 0
    assert metrics[f"data/skipped/{reason}"] == 1 and report.errors == [f"{path}: {line}"]
    with pytest.raises(ConversationError) as stop:
        load_conversations(path)  # on_error=stop: the first bad row is the error, in one line
    assert str(stop.value) == f"{path}: {line}" and stop.value.reason == reason


def test_a_json_list_with_one_bad_byte_loses_one_row_not_the_file(tmp_path: Path) -> None:
    import json

    from ready.data.conversations import load_conversations

    rows = [json.dumps(GOOD_ROW).encode()] * 200
    rows.insert(100, not_utf8_row())
    path = tmp_path / "chats.json"
    path.write_bytes(b"[" + b",\n".join(rows) + b"]")
    convs, report = load_conversations(path, on_error="skip")
    assert len(convs) == 200 and report.metrics()["data/rows_skipped"] == 1 and not report.skipped_files
    assert report.errors == [f"{path}: row 101: text that is not UTF-8 (at character 4 of 'caf\\udce9': a byte that is "
                             "not UTF-8, or a lone surrogate); expected UTF-8 text"]


def test_a_line_longer_than_a_row_may_be_is_one_skipped_row_never_kept(tmp_path: Path, monkeypatch) -> None:
    import gzip

    from ready.data import conversation_files
    from ready.data.conversations import load_conversations

    monkeypatch.setattr(conversation_files, "MAX_ROW_BYTES", 4096)
    path = jsonl_with(tmp_path, b'{"conversations": "' + b"x" * 20_000 + b'"}', name="long.jsonl.gz")
    path.write_bytes(gzip.compress(path.read_bytes()))
    convs, report = load_conversations(path, on_error="skip")
    assert len(convs) == 200 and report.metrics()["data/skipped/too_large"] == 1
    assert report.errors == [f"{path}: row 101 (line 101): a line of 20,021 bytes; expected at most 4,096 bytes per row"]


def test_the_training_data_logs_what_was_skipped_and_counts_it(tmp_path: Path, capsys) -> None:
    from ready.config import load_config
    from ready.data.training_chats import conversations_for

    path = jsonl_with(tmp_path, deep_row())
    cfg = load_config(overrides=[f"data.path={path}", "data.on_error=skip", "regen.num_samples=150"])
    convs, counts = conversations_for(cfg, None, "train", 150)
    assert len(convs) == 150 and counts["data/rows_skipped"] == 1 and counts["data/files_skipped"] == 0
    assert capsys.readouterr().err.splitlines() == [
        f"[ready] data.path = {path}: 200 conversations from 201 rows in 1 files (1 row(s) and 0 file(s) skipped); skipped: "
        f"too_deep 1 (data.on_error=skip); the first: {path}: row 101 (line 101): values nested more than 32 deep; "
        "expected a conversation row (an object of turns, a few levels deep)"]


def test_a_json_list_nested_beyond_the_parser_is_the_file_s_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    """A JSON list is one document: past the parser's depth there is no row end to resume from, so the file is
    the bad input (skipped whole under skip, and counted so); never a RecursionError."""
    import json

    from ready.data.conversations import ConversationError, load_conversations

    path = tmp_path / "deep.json"
    path.write_bytes(b"[" + json.dumps(GOOD_ROW).encode() + b"," + deep_row() + b"]")
    with pytest.raises(ConversationError) as stop:
        load_conversations(path)
    assert str(stop.value) == (f"{path}: nested deeper than the JSON parser goes; expected a JSON list of row objects (a "
                               "row nests at most 32 deep)")
    jsonl_with(tmp_path, b"", good=3)
    convs, report = load_conversations(tmp_path, on_error="skip")
    assert len(convs) == 3 and report.metrics()["data/files_skipped"] == 1 and report.metrics()["data/rows_skipped"] == 0
