"""Sweep specs: every layer merges onto the one schema, rows expand with stable hashes, and a
wrong spec ends in one message that names the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from sweeps.basegen import drift, render
from sweeps.run import main
from ready.config import ConfigError, merge, schema, validate
from sweeps.spec import EXPERIMENTS_DIR, SpecError, axis_settings, list_sweeps, load_sweep

SWEEPS = ["main", "ft_control", "rank", "layers", "inject_layer", "inject_pos", "search_loss", "positive_control"]


def test_base_yaml_restates_every_schema_default_with_a_comment():
    assert drift() == [], "experiments/base.yaml is out of date: run python -m sweeps.basegen --write"
    uncommented = [line for line in (EXPERIMENTS_DIR / "base.yaml").read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith("#") and "  # " not in line]
    assert uncommented == []


def test_basegen_rewrites_base_yaml_keeping_its_comments(tmp_path: Path):
    path = tmp_path / "base.yaml"
    text = (EXPERIMENTS_DIR / "base.yaml").read_text()
    path.write_text(text.replace("  rank: 8  # reader rank", "  # rank removed").replace("seed: 0  # seed of the ReaDy", "seed: 3  # seed of the ReaDy"))
    assert any("reader.rank" in d for d in drift(path)) and any(d.startswith("differs: seed") for d in drift(path))
    path.write_text(render(path))
    assert drift(path) == []
    assert "seed: 0  # seed of the ReaDy" in path.read_text()


def test_every_sweep_resolves_and_starts_with_its_command():
    assert set(SWEEPS) <= set(list_sweeps())
    for name in SWEEPS:
        text = (EXPERIMENTS_DIR / f"{name}.yaml").read_text()
        assert f"python -m sweeps.run {name}" in text.split("\n\n")[0]
        for extra in ([], ["profile=smoke"]):
            sweep = load_sweep(name, extra)
            controls = ["ft", "placebo"] if sweep.table not in ("table1", "") else ["dflash"] if name == "main" else []
            assert [b.method for b in sweep.baselines] == ["ar", "dspark", *controls]
            assert len({v.variant_id for v in sweep.rows}) == len(sweep.rows)


def test_rank_dry_run_lists_five_ranks_with_hashes(capsys):
    assert main(["rank", "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith("r=")]
    assert [r[1] for r in rows] == [f"r={r}" for r in (8, 16, 32, 64, 128) for _ in range(3)]  # 3 seeds each
    hashes = [r[5] for r in rows]
    assert len(set(hashes)) == 15 and all(len(h) == 12 for h in hashes)
    assert "AR" in out and "DSpark" in out and "DSpark + FT" in out and "Placebo" in out


def test_table_rows_carry_labels_methods_and_order():
    ft = load_sweep("ft_control")
    assert [(v.label, v.method, v.order) for v in ft.rows] == [
        ("AR", "ar", 0), ("DSpark", "dspark", 1), ("DSpark + FT", "ft", 2), ("Placebo (shuffled states)", "placebo", 3),
        ("ReaDy", "ready", 4)]
    control, placebo, ready = ft.rows[2:]
    assert control.cfg.reader.enabled is False
    assert placebo.cfg.reader.enabled is True and placebo.cfg.reader.states == "shuffled"
    assert ready.cfg.reader.states == "own"
    layers = load_sweep("layers")
    assert [list(v.cfg.reader.layers) for v in layers.variants] == [[2], [30], [62], [30, 62], [2, 30, 62]]
    pos = load_sweep("inject_pos")
    assert [v.cfg.reader.position for v in pos.variants] == ["pre", "post"]


def test_inject_layer_rows_that_name_the_same_layers_run_once():
    two = load_sweep("inject_layer")  # 2-layer drafter: {0,last} is every layer
    assert [v.label for v in two.variants] == ["{0}", "{last}", "{0,last} = all"]
    three = load_sweep("inject_layer", ["drafter.num_layers=3"])
    assert [v.label for v in three.variants] == ["{0}", "{last}", "{0,last}", "all"]
    assert list(three.variants[-1].cfg.reader.inject_layers) == [0, 1, 2]


def test_seeds_replicate_every_trained_row_and_its_base_drafter():
    sweep = load_sweep("rank", ["seeds=[0,1,2]"])
    jobs = sweep.jobs()
    assert len(jobs) == 1 + 3 * 3 + 5 * 3  # AR once; DSpark, FT, placebo and the five ranks per seed
    ready = [j for j in jobs if j.variant.method == "ready"]
    assert len({j.config_hash for j in ready}) == 15 and len({j.variant.variant_id for j in ready}) == 5
    dspark = [j for j in jobs if j.variant.method == "dspark"]
    assert [j.cfg.train.base_seed for j in dspark] == [0, 1, 2] and len({j.config_hash for j in dspark}) == 3
    assert all(j.cfg.train.base_seed == j.seed for j in jobs if j.variant.method != "ar")


def test_replicate_adaptation_keeps_one_base_drafter_for_every_seed():
    sweep = load_sweep("rank", ["seeds=[0,1,2]", "replicate=adaptation"])
    dspark = [j for j in sweep.jobs() if j.variant.method == "dspark"]
    assert len(dspark) == 1 and dspark[0].cfg.train.base_seed == 0
    assert {j.cfg.train.base_seed for j in sweep.jobs()} == {0}
    with pytest.raises(SpecError, match="'replicate'"):
        load_sweep("rank", ["replicate=everything"])


def test_hash_ignores_what_cannot_change_a_result_and_tracks_what_can():
    a = load_sweep("rank")
    b = load_sweep("rank", ["artifacts_dir=/elsewhere", "train.micro_batch_size=4"])  # same result up to rounding
    assert [j.config_hash for j in a.jobs()] == [j.config_hash for j in b.jobs()] and a.setting == b.setting
    c = load_sweep("rank", ["reader.mlp_hidden=128"])
    by = lambda s: {j.variant.label: j.config_hash for j in s.jobs()}  # noqa: E731
    assert by(a)["AR"] == by(c)["AR"] and by(a)["DSpark"] == by(c)["DSpark"]  # baselines never read the reader
    assert by(a)["r=8"] != by(c)["r=8"]
    assert a.setting != c.setting


def test_the_dflash_baseline_is_dspark_without_the_markov_head_and_moves_no_other_hash(tmp_path: Path):
    with_dflash = load_sweep("main")
    shutil.copytree(EXPERIMENTS_DIR, tmp_path / "experiments")
    spec = tmp_path / "experiments" / "main.yaml"
    spec.write_text(spec.read_text().replace("baselines: [ar, dspark, dflash]", "baselines: [ar, dspark]"))
    without = load_sweep("main", experiments_dir=tmp_path / "experiments")
    dflash = [b for b in with_dflash.baselines if b.method == "dflash"]
    assert len(dflash) == 1 and dflash[0].label == "DFlash" and dflash[0].cfg.drafter.head == "none"
    assert with_dflash.setting == without.setting
    hashes = {j.variant.label: j.config_hash for j in with_dflash.jobs()}
    assert {j.variant.label: j.config_hash for j in without.jobs()} == {k: v for k, v in hashes.items() if k != "DFlash"}
    assert hashes["DFlash"] != hashes["DSpark"]
    # without a Markov head its rank changes nothing, so it is not hashed (nor is the reader, as for DSpark)
    other = load_sweep("main", ["drafter.head_rank=8", "reader.rank=4"])
    assert {j.variant.label: j.config_hash for j in other.jobs()}["DFlash"] == hashes["DFlash"]
    with pytest.raises(SpecError, match="drafter.head"):
        load_sweep("main", ["drafter.head=lstm"])


def test_a_drafter_checkpoint_enters_row_hashes_by_its_contents_not_its_path(tmp_path: Path):
    def folder(name: str, weights: bytes) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"dflash_config": {"projector_type": "dspark"}}')
        (tmp_path / name / "model.safetensors").write_bytes(weights)
        return tmp_path / name

    by = lambda s: {j.variant.label: j.config_hash for j in s.jobs()}  # noqa: E731
    a, copy, other = folder("a", b"w1"), folder("copy", b"w1"), folder("other", b"w2")
    ha, hcopy, hother = (by(load_sweep("ft_control", [f"drafter.checkpoint={p}"])) for p in (a, copy, other))
    assert ha == hcopy and ha["DSpark"] != hother["DSpark"] and ha["AR"] == hother["AR"]
    assert ha["DSpark"] != by(load_sweep("ft_control"))["DSpark"]
    with pytest.raises(ConfigError, match=r"drafter.checkpoint': '.*nothing' is not a drafter folder; expected a DSpark"):
        load_sweep("ft_control", [f"drafter.checkpoint={tmp_path / 'nothing'}"]).jobs()


def test_profile_smoke_shrinks_budgets_and_search_trials():
    full, smoke = load_sweep("search_loss"), load_sweep("search_loss", ["profile=smoke"])
    assert smoke.common.pretrain.steps < full.common.pretrain.steps
    assert smoke.common.bench.limit == 2
    assert smoke.spec.search.n_trials == 2 and full.spec.search.n_trials == 16
    assert load_sweep("rank", ["profile=smoke"]).spec.search is None


@pytest.fixture
def experiments(tmp_path: Path) -> Path:
    """A copy of experiments/ to write bad specs into."""
    dst = tmp_path / "experiments"
    shutil.copytree(EXPERIMENTS_DIR, dst)
    return dst


@pytest.mark.parametrize("body, key", [
    ("config:\n  reader:\n    rnak: 8\nvariants:\n  - {label: a}\n", "reader.rnak"),
    ("grid:\n  values:\n    reader.rank: [8, 0]\n  label: 'r={reader.rank}'\n", "reader.rank"),
    ("variants:\n  - {label: bad, set: {reader.layers: 30}}\n", "reader.layers"),
    ("variants:\n  - {label: a}\nsedds: [0]\n", "sedds"),
])
def test_a_bad_spec_fails_with_one_message_naming_the_key(experiments: Path, body: str, key: str, capsys):
    (experiments / "bad.yaml").write_text("# python -m sweeps.run bad\ntable: table3\n" + body)
    with pytest.raises(SpecError) as err:
        load_sweep("bad", experiments_dir=experiments)
    msg = str(err.value)
    assert f"'{key}'" in msg and "\n" not in msg and "bad.yaml" in msg
    assert main(["bad", "--dry-run", "--experiments-dir", str(experiments)]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().count("\n") == 0 and key in captured.err and "Traceback" not in captured.err


def test_the_verify_schedule_axis_runs_each_schedule_as_its_own_setting(capsys):
    """`axes`: one sweep setting per schedule, each with its own AR and DSpark baselines and ReaDy row, the
    schedule in every row's config (and so in its hash); an axis given on the command line runs alone."""
    settings = axis_settings("verify_schedule", ["profile=smoke"])
    assert settings == [["profile=smoke", "eval.verify_schedule=full"], ["profile=smoke", "eval.verify_schedule=confidence"]]
    assert axis_settings("verify_schedule", ["eval.verify_schedule=confidence"]) == [["eval.verify_schedule=confidence"]]
    assert axis_settings("rank", ["seeds=[0]"]) == [["seeds=[0]"]]  # no axes: the command line as it is
    full, conf = (load_sweep("verify_schedule", o) for o in settings)
    assert full.setting != conf.setting
    for sweep, kind in ((full, "full"), (conf, "confidence")):
        assert [(v.method, v.cfg.eval.verify_schedule, bool(v.cfg.drafter.confidence_head)) for v in sweep.rows] == \
               [("ar", kind, True), ("dspark", kind, True), ("ready", kind, True)]
    assert {j.config_hash for j in full.jobs()}.isdisjoint({j.config_hash for j in conf.jobs()})
    assert main(["verify_schedule", "profile=smoke", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("sweep verify_schedule (verify_schedule)") == 2
    assert "setting eval.verify_schedule=full" in out and "setting eval.verify_schedule=confidence" in out


def test_an_axis_that_the_rows_also_sweep_is_refused(experiments: Path):
    (experiments / "both.yaml").write_text("# python -m sweeps.run both\ntable: t\naxes: {reader.rank: [8, 16]}\n"
                                           "grid: {values: {reader.rank: [8, 16]}}\n")
    with pytest.raises(SpecError, match="both a setting axis and swept"):
        load_sweep("both", experiments_dir=experiments)


def test_command_line_mistakes_name_the_key(capsys):
    for override, key in [("reader.rnak=3", "reader.rnak"), ("reader.layers=3", "reader.layers"),
                          ("reader.rank=16", "reader.rank"), ("reader.position=middle", "reader.position")]:
        assert main(["rank", override, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert key in err and err.strip().count("\n") == 0


def test_presets_resolve_and_the_paper_preset_reads_the_checkpoint_from_the_environment(monkeypatch):
    monkeypatch.setenv("READY_TARGET_DIR", "/models/qwen3.5-27b")
    paper = load_sweep("main", ["preset=qwen3_5_27b"]).common
    assert paper.target.source == "/models/qwen3.5-27b" and paper.target.pretrain is False
    assert len(paper.bench.suites) == 7 and paper.drafter.proposals == 6
    with pytest.raises(ConfigError, match="'/path/to/dspark_drafter_dir' is not a drafter folder"):
        load_sweep("rank", ["preset=local_checkpoint_template", "target.source=/models/mine"])
    template = load_sweep("rank", ["preset=local_checkpoint_template", "target.source=/models/mine",
                                   "drafter.checkpoint=null"]).common
    assert template.target.source == "/models/mine" and set(template.bench.paths) == set(template.bench.suites)
    with pytest.raises(SpecError, match="preset 'nope' not found"):
        load_sweep("rank", ["preset=nope"])


def test_training_and_evaluation_positions_that_do_not_overlap_are_reported(capsys):
    from ready.config import length_mismatch, merge, schema

    aligned = merge(schema(), {"regen": {"prompt_len": 128, "response_len": 48},
                               "bench": {"max_prompt_tokens": 128}, "eval": {"max_new_tokens": 48}})
    assert length_mismatch(aligned) is None
    short = merge(aligned, {"regen": {"response_len": 16}})
    why = length_mismatch(short)
    assert "regen.response_len=16 < eval.max_new_tokens=48" in why and "position 144" in why
    assert main(["rank", "--dry-run", "regen.response_len=8"]) == 0  # a warning, not an error
    assert "warning: the drafter is trained on other positions" in capsys.readouterr().err


def test_workers_are_the_idle_cores_divided_by_a_rows_threads(monkeypatch):
    from sweeps import run

    monkeypatch.undo()  # conftest pins tests to one worker; this test checks the CLI's own default
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(run, "gpu_ids", lambda: [])
    monkeypatch.setattr(run, "_busy_cpus", lambda: 0.1)
    assert [run.default_workers(threads=t) for t in (1, 2, 3, 8)] == [4, 2, 1, 1]
    monkeypatch.setattr(run, "_busy_cpus", lambda: 3.2)  # another job holds 3 cores
    assert run.default_workers(threads=1) == 1
    monkeypatch.setattr(run, "_busy_cpus", lambda: None)  # no /proc/stat: the load average decides
    monkeypatch.setattr(run.os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    assert run.default_workers(threads=1) == 2


def test_a_rows_thread_count_is_part_of_its_hash():
    """Another thread count adds CPU sums in another order: another run, never the stored one."""
    one, two = load_sweep("rank", ["seeds=[0]"]), load_sweep("rank", ["seeds=[0]", "threads.drafters=2"])
    assert not {j.config_hash for j in one.jobs()} & {j.config_hash for j in two.jobs()}
    assert one.setting != load_sweep("rank", ["seeds=[0]", "threads.shared=1"]).setting


def test_busy_cpus_reads_this_machines_cpu_time():
    from sweeps import run

    busy = run._busy_cpus(0.05)
    if busy is None:
        pytest.skip("no /proc/stat here")
    assert 0.0 <= busy <= run._cpu_times()[2] + 1e-9


def test_without_gpus_a_sweep_takes_one_worker_per_idle_core_and_one_with_gpus(monkeypatch):
    from sweeps import run

    monkeypatch.undo()  # conftest pins tests to one worker; this test checks the CLI's own default
    monkeypatch.setattr(run.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(run, "_busy_cpus", lambda: 0.2)
    monkeypatch.setattr(run, "gpu_ids", lambda: [])
    assert run.default_workers() == 2
    monkeypatch.setattr(run, "_busy_cpus", lambda: 1.4)  # another job holds a core
    assert run.default_workers() == 1
    monkeypatch.setattr(run, "_busy_cpus", lambda: 0.0)
    monkeypatch.setattr(run, "gpu_ids", lambda: ["0"])
    assert run.default_workers() == 1


def test_exact_mode_auto_is_on_for_16_bit_targets_and_keeps_float32_hashes():
    from ready.config import exact_mode
    from sweeps.spec import job_hash

    cfg = merge(schema(), {})
    assert cfg.eval.exact == "auto" and exact_mode(cfg) is False  # float32: the fast path is bit-identical
    bf16 = merge(cfg, {"target": {"dtype": "bfloat16"}})
    assert exact_mode(bf16) is True
    assert exact_mode(merge(bf16, {"eval": {"exact": False}})) is False
    assert exact_mode(merge(cfg, {"eval": {"exact": "on"}})) is True
    # auto and the value it resolves to are one decoding, so one row
    assert job_hash(cfg, "ready") == job_hash(merge(cfg, {"eval": {"exact": "off"}}), "ready")
    assert job_hash(bf16, "ready") == job_hash(merge(bf16, {"eval": {"exact": True}}), "ready")
    with pytest.raises(ConfigError, match="eval.exact"):
        validate(merge(cfg, {"eval": {"exact": "sometimes"}}))


@pytest.mark.parametrize("key, value", [("target.attention_window", 16), ("pretrain.repeat_fraction", 0.5),
                                        ("regen.temperature", 0.7), ("regen.top_p", 0.9), ("data.path", "/d.jsonl"),
                                        ("data.format", "sharegpt"), ("data.on_error", "skip"),
                                        ("data.responses", "original")])
def test_a_knob_added_later_hashes_rows_as_before_it_at_its_default(key, value):
    from sweeps.spec import _DEFAULT_NOT_HASHED, job_hash

    cfg = merge(schema(), {})
    assert OmegaConf.select(cfg, key) == _DEFAULT_NOT_HASHED[key]
    assert job_hash(cfg, "ready") != job_hash(merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"])), "ready")
    tree = OmegaConf.to_container(cfg)
    section, name = key.split(".")
    del tree[section][name]  # a row resolved before the knob existed
    if section == "data":  # a section added later: rows before it had none
        del tree["data"]
    assert job_hash(OmegaConf.create(tree), "ready") == job_hash(cfg, "ready")


@pytest.mark.parametrize("method", ["ar", "dspark", "ready"])
def test_a_knob_removed_later_hashes_rows_as_before_it(method):
    """A key that left the schema (ready.config.RETIRED: eval.use_kernels) hashes at the value every earlier
    row had, so finished rows and their settings are still found."""
    from sweeps.spec import canonical, job_hash

    cfg = merge(schema(), {})
    assert "use_kernels" not in cfg.eval and canonical(cfg, method)["config"]["eval"]["use_kernels"] is True
    tree = OmegaConf.to_container(cfg)
    tree["eval"]["use_kernels"] = True  # a row resolved before the key was removed
    assert job_hash(OmegaConf.create(tree), method) == job_hash(cfg, method)


@pytest.mark.parametrize("method", ["ar", "dspark", "ready"])
def test_a_renamed_knob_hashes_under_its_old_name_and_a_queued_trial_with_it_runs_as_before(method):
    """`drafter.proposals` (K) hashes as `drafter.block_size` = K + 1 did (ready.config.RENAMED), so rows, settings
    and trained drafters keep their hashes (tests/test_hash_pins.py); a trial queued before the rename, its
    stored config saying block_size, loads into the very job it was."""
    from sweeps.spec import canonical, job_hash
    from sweeps.study import job_attrs, job_from_attrs

    drafter = canonical(merge(schema(), {}), method)["config"].get("drafter")
    assert drafter is None if method == "ar" else (drafter["block_size"] == 8 and "proposals" not in drafter)
    sweep = load_sweep("main", ["preset=qwen3_5_27b"])
    job = next(j for j in sweep.jobs() if j.variant.method == method)
    attrs = job_attrs(job, sweep)
    attrs["config"]["drafter"]["block_size"] = attrs["config"]["drafter"].pop("proposals") + 1
    assert attrs["config"]["drafter"]["block_size"] == 7
    back = job_from_attrs(attrs)
    assert back.cfg.drafter.proposals == 6 and job_hash(back.cfg, method) == job.config_hash


def test_rows_hash_as_before_the_concurrency_key_unless_they_batch():
    from sweeps.spec import canonical, job_hash

    one = merge(schema(), {"eval": {"concurrency": 1}})
    assert "concurrency" not in canonical(one, "ready")["config"]["eval"]  # rows run before the key stay found
    assert job_hash(merge(one, {"eval": {"concurrency": 4}}), "ready") != job_hash(one, "ready")
    assert canonical(merge(schema(), {}), "ready")["config"]["eval"]["concurrency"] == 8  # today's default batches


@pytest.mark.parametrize("method", ["dspark", "ready"])
def test_the_confidence_labels_temperature_moves_only_the_rows_that_train_a_head(method):
    """train.loss.confidence_temperature decides the head's label, and so the base drafter (the head's loss
    reaches its layers): it is hashed where the base drafter trains a head, never elsewhere, so the rows
    without one keep their hashes; a row at 1 (DeepSpec's label, every head's before the knob) hashes as
    before it, and one at the default 0 is another row."""
    from sweeps.spec import canonical, job_hash

    plain = merge(schema(), {})
    assert plain.train.loss.confidence_temperature == 0.0  # greedy, as eval.temperature
    assert "confidence_temperature" not in canonical(plain, method)["config"]["train"]["loss"]
    assert job_hash(merge(plain, {"train": {"loss": {"confidence_temperature": 1.0}}}), method) == job_hash(plain, method)
    head = merge(plain, {"drafter": {"confidence_head": True}})
    assert job_hash(merge(head, {"train": {"loss": {"confidence_temperature": 1.0}}}), method) != job_hash(head, method)
    before = OmegaConf.to_container(head)
    del before["train"]["loss"]["confidence_temperature"]  # a row resolved before the knob (its head: the T = 1 label)
    assert job_hash(OmegaConf.create(before), method) != job_hash(head, method)
    assert job_hash(OmegaConf.create(before), method) == \
        job_hash(merge(head, {"train": {"loss": {"confidence_temperature": 1.0}}}), method)


def _fake_corpus(root: Path, flavour: str) -> Path:
    """A corpus folder of 60 small modules; `flavour` changes one of them (another version's sources)."""
    for i in range(60):
        (root / f"mod{i:02d}.py").parent.mkdir(parents=True, exist_ok=True)
        (root / f"mod{i:02d}.py").write_text(f'"""Module {i}."""\n\nVALUE = {i}\n' + (flavour if i == 7 else ""))
    return root


def test_another_corpus_is_another_setting(tmp_path: Path, monkeypatch):
    """The embedded target is pretrained on the corpus: one config on two corpora builds two targets, so
    their runs must never be reused or paired as one setting. The rows' own hashes stay the config's."""
    import ready.data.corpus as corpus

    settings, hashes = [], []
    for flavour in ("", "EXTRA = 1\n", ""):
        folder = _fake_corpus(tmp_path / f"lib{len(flavour)}", flavour)
        monkeypatch.setattr(corpus, "_package_corpus", lambda *args, f=folder: corpus.load_corpus(
            dict(zip(("heldout_fraction", "max_files", "max_file_kb", "seed"), args)), root=f))
        sweep = load_sweep("rank", ["seeds=[0]"])
        settings.append(sweep.setting)
        hashes.append([j.config_hash for j in sweep.jobs()])
    assert settings[0] != settings[1] and settings[0] == settings[2]
    assert hashes[0] == hashes[1] == hashes[2]


def test_another_version_of_the_corpus_package_stops_the_sweep_in_one_line(tmp_path: Path, monkeypatch):
    import json

    import ready.data.corpus as corpus

    manifest = json.loads(corpus.MANIFEST.read_text())
    (tmp_path / "m.json").write_text(json.dumps({**manifest, "version": "0.0.1"}))
    monkeypatch.setattr(corpus, "MANIFEST", tmp_path / "m.json")
    corpus._package_corpus.cache_clear()
    try:
        with pytest.raises(SpecError, match=rf"^corpus: sympy {manifest['version']} is installed; expected "
                                            r"sympy==0\.0\.1, whose sources are the embedded corpus"):
            load_sweep("rank", ["seeds=[0]"])
    finally:
        corpus._package_corpus.cache_clear()


def test_a_checkpoints_new_weights_are_another_setting(tmp_path: Path):
    """A checkpoint folder is named by path in the config; its weights' content decides the setting too."""
    ckpt = tmp_path / "target"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights one")
    before = load_sweep("rank", ["seeds=[0]", f"target.source={ckpt}"]).setting
    assert load_sweep("rank", ["seeds=[0]", f"target.source={ckpt}"]).setting == before
    (ckpt / "model.safetensors").write_bytes(b"weights two, longer")
    assert load_sweep("rank", ["seeds=[0]", f"target.source={ckpt}"]).setting != before


def test_a_rewritten_dataset_or_benchmark_file_is_another_setting(tmp_path: Path):
    """`data.path` and `bench.paths` name files; a file rewritten under the same name is another setting."""
    chats, prompts = tmp_path / "chats.jsonl", tmp_path / "prompts.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    prompts.write_text('{"turns": ["What is 2 + 2?"]}\n')
    args = ["seeds=[0]", f"data.path={chats}", f"bench.paths.mine={prompts}"]
    before = load_sweep("rank", args).setting
    assert load_sweep("rank", args).setting == before
    assert load_sweep("rank", ["seeds=[0]", f"data.path={chats}"]).setting != before  # without the prompts file
    chats.write_text(chats.read_text() * 2)
    after_chats = load_sweep("rank", args).setting
    prompts.write_text('{"turns": ["What is 30 + 30?"]}\n')
    assert len({before, after_chats, load_sweep("rank", args).setting}) == 3
