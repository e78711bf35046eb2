"""The faults an adversarial probe still got through (issue 43), each run as the probe ran it: the
command, its exit status, its one line, and what is (not) in the store or cache afterwards.

S below is the probe's sweep, `python -m sweeps.run main profile=smoke ...` with its own store and
run folder; where a case does not need real rows it runs the smallest sweep (fault_helpers.SWEEP)
with a fake runner instead of training.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch

from fault_helpers import errors, fake_runner_env, sweep_args, wait_for_a_started_row
from sweeps.run import main
from sweeps.spec import EXPERIMENTS_DIR


def children(uri: str, sweep: str = "inject_pos") -> list:
    """The child (row) runs of a sweep in the store at `uri`."""
    from sweeps import tracking

    c = tracking.client(uri)
    exp = c.get_experiment_by_name(f"ready-{sweep}")
    return list(c.search_runs([exp.experiment_id], "tags.`ready.kind` = 'variant'")) if exp else []


def probe_args(tmp_path: Path, *args: str) -> list[str]:
    """The probe's own store and run folder (neither may exist after a refused command)."""
    return [*args, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--run-dir", str(tmp_path / "run"),
            "--workers", "1", "--quiet"]


def nothing_written(tmp_path: Path) -> bool:
    return not (tmp_path / "mlflow.db").exists() and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# 1. A NaN checkpoint decoded in silence

WORDS = ["<|endoftext|>", "def", "add(a,", "b):", "return", "a", "+", "b"]


def word_tokenizer():
    """A word-level tokenizer that knows the probe's prompt, "def add(a, b):"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_checkpoint(folder: Path, head: float = 0.0) -> Path:
    """A tiny hybrid target with its tokenizer, as `sweeps.commands.generate --target DIR` reads it."""
    from ready.target import HybridConfig, HybridLM, save_target

    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                       max_position_embeddings=64)
    model = HybridLM(cfg).eval()
    if head:
        with torch.no_grad():
            model.lm_head.weight.fill_(head)
    return save_target(model, folder, tokenizer=word_tokenizer())


def nan_weight(folder: Path) -> str:
    """One weight set to NaN (the probe's first variant): rewritten with safetensors."""
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    state = load_file(str(file))
    name = sorted(k for k, v in state.items() if v.ndim == 2)[0]
    state[name][0, 0] = float("nan")
    save_file(state, str(file), metadata={"format": "pt"})
    return name


def nan_bytes(folder: Path) -> str:
    """NaN bytes written into the safetensors file over one tensor's first value (the second variant)."""
    file = folder / "model.safetensors"
    raw = bytearray(file.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = sorted(k for k in header if k != "__metadata__")[0]
    start = 8 + n + header[name]["data_offsets"][0]
    raw[start:start + 4] = b"\xff\xff\xff\x7f"  # a float32 NaN
    file.write_bytes(bytes(raw))
    return name


@pytest.mark.parametrize("break_it", [nan_weight, nan_bytes])
def test_generate_refuses_a_checkpoint_with_nan_weights(break_it, tmp_path: Path, capsys) -> None:
    from sweeps.commands.generate import main as generate

    folder = tiny_checkpoint(tmp_path / "target")
    (folder / "DONE").unlink()  # a user's folder: no manifest to catch the change first
    name = break_it(folder)
    code = generate(["--target", str(folder), "--method", "ngram", "--prompt", "def add(a, b):",
                     "--max-new-tokens", "8", "--json", "target.device=cpu"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""  # no JSON with "token_ids": [0]
    assert errors(out.err) == [f"error: target {folder}: weight {name} holds NaN or Inf values; expected finite "
                               "weights (a broken or corrupted checkpoint)"]


def test_generate_refuses_a_target_whose_logits_overflow(tmp_path: Path, capsys) -> None:
    from sweeps.commands.generate import main as generate

    folder = tiny_checkpoint(tmp_path / "target", head=3e38)  # finite weights, logits beyond float32
    code = generate(["--target", str(folder), "--method", "ngram", "--prompt", "def add(a, b):",
                     "--max-new-tokens", "8", "--json", "target.device=cpu"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert errors(out.err) == [f"error: target {folder}: logits hold NaN or Inf (first at probe position 0 of 3); "
                               "expected finite logits from a working model"]


# ---------------------------------------------------------------------------------------------
# 2. Two sweeps started together on one new mlflow.db, each with its own --run-dir


def test_two_sweeps_with_their_own_run_dirs_run_each_row_once(tmp_path: Path) -> None:
    import subprocess
    import sys
    from collections import Counter

    from sweeps.spec import load_sweep

    log = tmp_path / "calls.jsonl"
    log.touch()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = fake_runner_env(log, 1.5)
    procs = [subprocess.Popen([sys.executable, "-m", "sweeps.run", "main", "profile=smoke", "--runner",
                               "test_sweeps_fake_runner", "--tracking-uri", uri, "--run-dir", str(tmp_path / f"run-{i}"),
                               "--workers", "1", "--no-report", "--quiet"],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    jobs = {j.config_hash for j in load_sweep("main", ["profile=smoke"]).jobs()}
    starts = Counter(json.loads(line)["hash"] for line in log.read_text().splitlines() if '"start"' in line)
    assert starts == Counter({h: 1 for h in jobs})  # each row ran in one of the two, once
    runs = children(uri, "main")
    assert sorted(r.data.tags["ready.config_hash"] for r in runs if r.info.status == "FINISHED") == sorted(jobs)
    assert [r for r in runs if r.info.status != "FINISHED"] == []


def test_a_killed_sweeps_row_does_not_block_a_sweep_with_another_run_dir(tmp_path: Path, capsys) -> None:
    """The claim of a SIGKILLed worker is not a live claim: the next invocation, with its own run folder
    (so its own queue, which never saw that trial), marks it KILLED and runs the row."""
    import signal
    import subprocess
    import sys

    log = tmp_path / "calls.jsonl"
    log.touch()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = fake_runner_env(log, 300)
    args = sweep_args(uri, tmp_path / "a", runner="test_sweeps_fake_runner")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", *args], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_a_started_row(proc, log)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (dead,) = children(uri)
    assert dead.info.status == "RUNNING"
    capsys.readouterr()
    assert main(sweep_args(uri, tmp_path / "b", runner="test_sweeps_fake_runner")) == 0
    runs = children(uri)
    assert {r.info.run_id: r.info.status for r in runs}[dead.info.run_id] == "KILLED"
    assert len([r for r in runs if r.info.status == "FINISHED"]) == 6  # every row, the killed one's too


def test_a_claim_on_another_host_lives_as_long_as_its_heartbeat() -> None:
    from types import SimpleNamespace

    from sweeps import study, tracking

    def run(beat: float):
        return SimpleNamespace(data=SimpleNamespace(tags={"ready.host": "another-host", "ready.pid": "1",
                                                          "ready.heartbeat": repr(beat)}),
                               info=SimpleNamespace(start_time=0))

    now = 1e9
    assert tracking.claim_alive(run(now - 30), now=now)
    assert not tracking.claim_alive(run(now - study.STALE_AFTER_S - 1), now=now)


def test_the_heartbeat_also_refreshes_the_claim_in_the_store() -> None:
    import time

    import optuna

    from sweeps import study as st

    class Store:
        def __init__(self) -> None:
            self.tags: list[tuple[str, str, str]] = []

        def set_tag(self, run_id: str, key: str, value: str) -> None:
            self.tags.append((run_id, key, value))

    trial = optuna.create_study(storage=optuna.storages.InMemoryStorage()).ask()
    store = Store()
    with st.Heartbeat(trial.study, trial._trial_id, interval=0.05) as beat:  # noqa: SLF001
        beat.run = (store, "run-1")
        time.sleep(0.3)
    assert len(store.tags) >= 2 and {(r, k) for r, k, _ in store.tags} == {("run-1", "ready.heartbeat")}
    assert float(store.tags[-1][2]) > float(store.tags[0][2])


# ---------------------------------------------------------------------------------------------
# 3. A report that writes into a foreign database


@pytest.mark.parametrize("kind", ["foreign sqlite", "zero bytes"])
def test_reports_build_leaves_a_file_that_is_not_an_mlflow_store_as_it_is(kind: str, tmp_path: Path, capsys) -> None:
    import sqlite3

    from reports.build import main as reports_main

    db = tmp_path / "other.db"
    db.touch()
    if kind == "foreign sqlite":
        with sqlite3.connect(db) as con:
            con.execute("create table notes (body text)")
            con.execute("insert into notes values ('mine')")
    before = db.read_bytes()
    uri = f"sqlite:///{db}"
    assert reports_main(["--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: tracking URI {uri!r}: {db} is not an MLflow store (a SQLite file without MLflow's tables; left as "
        "it is); expected the store a sweep wrote (an mlflow.db or a tracking server)"]
    assert db.read_bytes() == before  # no MLflow schema written into it
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 4. A benchmark file with one 30 MB line


def test_a_30_mb_prompt_is_tokenized_from_its_end_only(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from ready.config import BenchmarkConfig
    from ready.data.benchmarks import TAIL_CHARS_PER_TOKEN, load_suite

    huge = "def add(a, b):\n" + "return a + b\n" * 2_500_000  # 30 MB
    file = tmp_path / "HumanEval.jsonl"
    file.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": huge}) + "\n"
                    + json.dumps({"task_id": "HumanEval/1", "prompt": "def add(a, b):\n"}) + "\n")
    assert file.stat().st_size > 30_000_000
    class Spy:
        """The word tokenizer, noting how long each text it is given is."""

        chat_template = None

        def __init__(self) -> None:
            self.tokenizer, self.seen = word_tokenizer(), []

        def __call__(self, text: str, **kwargs):
            self.seen.append(len(text))
            return self.tokenizer(text, **kwargs)

        def decode(self, ids: list[int]) -> str:
            return self.tokenizer.decode(ids)

    spy = Spy()
    bench = OmegaConf.structured(BenchmarkConfig(paths={"humaneval": str(file)}, limit=2, max_prompt_tokens=32))
    first, second = load_suite("humaneval", bench, spy)
    assert first.ids == [WORDS.index(w) for w in ("return", "a", "+", "b")] * 8  # its last 32 tokens
    assert second.ids == [1, 2, 3]
    assert max(spy.seen) <= 32 * TAIL_CHARS_PER_TOKEN  # never the whole 30 MB


def test_a_prompt_kept_whole_may_not_be_30_mb(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from ready.config import BenchmarkConfig
    from ready.data.benchmarks import BenchmarkError, load_suite

    file = tmp_path / "HumanEval.jsonl"
    file.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "a + b\n" * 5_000_000}) + "\n")
    bench = OmegaConf.structured(BenchmarkConfig(paths={"humaneval": str(file)}, limit=2, max_prompt_tokens=0))
    with pytest.raises(BenchmarkError) as e:
        load_suite("humaneval", bench, word_tokenizer())
    assert str(e.value) == (f"benchmark 'humaneval': file {str(file)!r}, record 0: a prompt of 30,000,000 characters "
                            "with bench.max_prompt_tokens=0 (kept whole); expected at most 1,000,000 characters, or "
                            "bench.max_prompt_tokens > 0 to keep its last tokens")


# ---------------------------------------------------------------------------------------------
# 5. bench.limit=0 and -1 ran every prompt


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_bench_limit_below_one_is_refused_before_anything_runs(value: str, tmp_path: Path, capsys) -> None:
    assert main(probe_args(tmp_path, "main", "profile=smoke", f"bench.limit={value}")) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: command line: bad value at key 'bench.limit': {value}; expected an integer >= 1 (prompts per "
        "benchmark; a file with fewer records gives all it has)"]
    assert nothing_written(tmp_path)


# ---------------------------------------------------------------------------------------------
# 6. kill -INT to the coordinator of a 2-worker sweep was ignored


def test_sigint_to_the_coordinator_of_two_workers_stops_the_sweep(tmp_path: Path) -> None:
    """Started as a script's background job is (SIGINT ignored), then `kill -INT` to the coordinator alone."""
    import signal
    import subprocess
    import sys
    import time


    log = tmp_path / "calls.jsonl"
    log.touch()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = fake_runner_env(log, 300)
    args = sweep_args(uri, tmp_path, runner="test_sweeps_fake_runner")
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.run", *args[:-2], "--workers", "2"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.time() + 180
        while log.read_text().count('"start"') < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert log.read_text().count('"start"') == 2, "the two workers never started their rows"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # it ran on for 29 s and exited 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of it and its workers
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "[sweeps] interrupted; a re-run picks up the unfinished rows" in err
    runs = children(uri)
    assert len(runs) == 2 and {r.info.status for r in runs} == {"KILLED"}  # the two rows that had started
    from sweeps import tracking

    c = tracking.client(uri)
    (parent,) = c.search_runs([runs[0].info.experiment_id], "tags.`ready.kind` = 'sweep'")
    assert parent.info.status == "KILLED"


# ---------------------------------------------------------------------------------------------
# 7. Tracebacks: a read-only run folder or store folder, a full disk


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in: a mode 555 one, or for root (whom modes do not stop) /sys/fs."""
    if os.geteuid() == 0:
        return Path("/sys/fs")
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    return folder


def test_a_read_only_run_dir_is_one_line_and_nothing_is_stored(tmp_path: Path, capsys) -> None:
    folder = unwritable_folder(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main([*sweep_args(uri, tmp_path), "--run-dir", str(folder)]) == 2  # the last --run-dir counts
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"error: --run-dir {folder}: cannot write in it (") and line.endswith(
        "); expected a writable folder for the Optuna journal and the workers' logs")
    assert not (tmp_path / "mlflow.db").exists()  # refused before the store is opened


def test_a_read_only_folder_for_mlflow_db_is_one_line(tmp_path: Path, capsys) -> None:
    folder = unwritable_folder(tmp_path)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    assert main(sweep_args(uri, tmp_path)) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"error: tracking URI {uri!r}: cannot write in {folder} (") and line.endswith(
        "); expected a writable folder for the MLflow store")
    assert not (folder / "mlflow.db").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_artifacts_dir_fails_each_row_in_one_line(tmp_path: Path, capsys) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "full").symlink_to("/dev/full")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(sweep_args(uri, tmp_path, f"artifacts_dir={artifacts}", runner="fault_helpers:full_disk_run_variant")) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    failed = [ln for ln in err.splitlines() if ln.startswith("[sweeps] FAILED")]
    assert len(failed) == 6 and all(ln.endswith("OSError: [Errno 28] No space left on device") for ln in failed)
    runs = children(uri)
    assert len(runs) == 6 and {r.info.status for r in runs} == {"FAILED"}
    assert all("No space left on device" in r.data.tags["ready.error"] for r in runs)


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


def variant_runs(tmp_path: Path) -> list:
    """The child runs of the probe's store (sweep `main`)."""
    return children(f"sqlite:///{tmp_path / 'mlflow.db'}", "main")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("probe") / "target")


def test_a_prompt_that_is_a_number_names_the_file_the_record_and_the_field(checkpoint: Path, tmp_path: Path,
                                                                            capsys) -> None:
    file = tmp_path / "HumanEval.jsonl"
    file.write_text('{"task_id": "HumanEval/0", "prompt": "def add(a, b):"}\n{"task_id": "HumanEval/1", "prompt": 5}\n')
    assert main(probe_args(tmp_path, "main", "profile=smoke", f"target.source={checkpoint}", "bench.suites=[humaneval]",
                           f"bench.paths.humaneval={file}", "--no-report")) == 2
    assert errors(capsys.readouterr().err) == [
        f"error: benchmark 'humaneval': file {str(file)!r} is malformed (record 1: field 'prompt' holds 5 (int), not a "
        "string); expected HumanEval JSONL(.gz) records with 'task_id' and 'prompt' fields, or a turns file (DeepSpec "
        "eval_datasets/*.jsonl): records with 'turns', a non-empty list of non-empty strings (the user turns)"]
    assert variant_runs(tmp_path) == []


def test_a_one_record_file_says_the_file_is_short_not_the_limit(checkpoint: Path, tmp_path: Path, capsys) -> None:
    file = tmp_path / "HumanEval.jsonl"
    file.write_text('{"task_id": "HumanEval/0", "prompt": "def add(a, b):"}\n')
    assert main(probe_args(tmp_path, "main", "profile=smoke", f"target.source={checkpoint}", "bench.suites=[humaneval]",
                           f"bench.paths.humaneval={file}", "--no-report")) == 2
    assert errors(capsys.readouterr().err) == [
        "error: benchmark 'humaneval': 1 prompt(s), but the state swap (eval.state_reliance) reads another prompt's "
        f"states, so it needs at least 2: its file {str(file)!r} holds only 1 (bench.limit=2); expected at least 2 "
        "records there"]
    assert variant_runs(tmp_path) == []  # refused before any row trains
    assert main(probe_args(tmp_path, "main", "profile=smoke", f"target.source={checkpoint}", "bench.suites=[humaneval]",
                           f"bench.paths.humaneval={file}", "bench.limit=1", "--no-report")) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.endswith("so it needs at least 2: bench.limit=1; expected bench.limit >= 2")


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


# ---------------------------------------------------------------------------------------------
# 9. Smaller (the closed port's message: tests/test_store_faults.py, the unreachable tracking server)


def test_a_broken_artifact_is_reported_once_however_often_it_is_checked(tmp_path: Path, capsys) -> None:
    """The pipeline asks `built()` and then the stage itself whether a folder is intact: one line."""
    from ready.artifacts import cached, intact

    spec = {"kind": "toy", "n": 1}
    builds = []

    def build(tmp: Path) -> None:
        builds.append(1)
        (tmp / "weights.bin").write_bytes(b"\x01" * 64)

    folder = cached(tmp_path, "toy", spec, build)
    (folder / "weights.bin").write_bytes(b"\x02" * 64)  # same size, other content
    capsys.readouterr()
    assert not intact(folder, spec, label=f"toy/{folder.name}")  # pipeline.built()
    assert cached(tmp_path, "toy", spec, build) == folder  # the stage: rebuilds it
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"[ready] artifact toy/{folder.name} failed verification (weights.bin: content differs from the "
                     "sha256 the marker recorded); rebuilding it"]
    assert len(builds) == 2 and (folder / "weights.bin").read_bytes() == b"\x01" * 64
    (folder / "weights.bin").write_bytes(b"\x03" * 64)  # broken again after the rebuild: said again
    assert not intact(folder, spec, label=f"toy/{folder.name}")
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_ar_generations_are_found_again_after_artifacts_dir_moves(tmp_path: Path, monkeypatch) -> None:
    """The AR cache is keyed by the target's contents, not its path: artifacts_dir enters no hash."""
    import shutil

    import sweeps.row
    from ready.config import schema
    from ready.loading import LoadedTarget
    from ready.target import load_target
    from sweeps.row import ar_generations

    def loaded(root: Path) -> LoadedTarget:
        path = root / "target" / "tiny"
        return LoadedTarget(load_target(path), word_tokenizer(), 0, str(path), "cpu")

    cfg = schema()
    cfg.eval.max_new_tokens, cfg.eval.warmup_rounds = 4, 0
    suites = {"humaneval": [[1, 2, 3], [2, 3, 4]]}
    first = tmp_path / "artifacts"
    tiny_checkpoint(first / "target" / "tiny")
    cfg.artifacts_dir = str(first)
    before = ar_generations(cfg, loaded(first), suites, progress=False)
    moved = tmp_path / "elsewhere" / "artifacts"
    shutil.copytree(first, moved)
    shutil.rmtree(first)

    def no_decoding(*args, **kwargs):
        raise AssertionError("AR generations decoded again")

    monkeypatch.setattr(sweeps.row, "run_ar", no_decoding)
    cfg.artifacts_dir = str(moved)
    after = ar_generations(cfg, loaded(moved), suites, progress=False)
    assert [g.tokens for g in after["humaneval"]] == [g.tokens for g in before["humaneval"]]
    assert len(list((moved / "ar").iterdir())) == 1  # the copied folder, nothing new beside it
