"""One config loader for every entry point (issue 45, item 3): for every preset, profile, config file
and a few override sets, the loader gives exactly the config each entry point built before it had
one loader. The `_old_*` functions are frozen copies of those earlier code paths (sweeps.commands.train_launch,
benchmarks.train_scale, benchmarks.engine, sweeps.commands.generate, the `schema <- a.b=v` commands and
sweeps.spec), kept here only as the reference the loader must reproduce."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from ready.config import EXPERIMENTS_DIR, Config, load_config, merge, schema, validate

PRESETS = sorted(p.stem for p in (EXPERIMENTS_DIR / "presets").glob("*.yaml"))
PROFILES = sorted(p.stem for p in (EXPERIMENTS_DIR / "profiles").glob("*.yaml"))
OVERRIDES = [
    [],
    ["reader.rank=16", "eval.max_new_tokens=32", "train.stage1.lr=0.002"],
    ["reader.layers=[2,30]", "bench.paths.humaneval=/x.jsonl", "target.dtype=bfloat16", "name=mine"],
    ["drafter.checkpoint=null", "regen.num_samples=7", "reader.inject_layers=[-1]", "reader.rank=4"],
]


# --- frozen copies of the earlier code paths ------------------------------------------------------

def _old_launch(preset: Optional[str], config: Optional[str], overrides: Sequence[str]) -> DictConfig:
    """sweeps.commands.train_launch.load_config before issue 45."""
    cfg = schema()
    layers = [EXPERIMENTS_DIR / "base.yaml"] + ([EXPERIMENTS_DIR / "presets" / f"{preset}.yaml"] if preset else [])
    layers += [Path(config)] if config else []
    for path in layers:
        assert path.is_file()
        cfg = merge(cfg, OmegaConf.load(path), source=str(path))
    cfg = merge(cfg, OmegaConf.from_dotlist(list(overrides)), source="command line")
    validate(cfg)
    return cfg


def _old_train_scale(preset: str, profile: Optional[str], overrides: Sequence[str]) -> DictConfig:
    """benchmarks.train_scale.bench_config before issue 45."""
    cfg = _old_launch(preset, None, [])
    if profile:
        path = EXPERIMENTS_DIR / "profiles" / f"{profile}.yaml"
        cfg = merge(cfg, OmegaConf.load(path).get("config") or {}, source=str(path))
    cfg = merge(cfg, OmegaConf.from_dotlist(list(overrides)), source="command line")
    validate(cfg)
    return cfg


def _old_engine(preset: str, proposals: int) -> tuple[Any, Any]:
    """benchmarks.engine.drafter_configs before issue 45 (the drafter and reader sections only)."""
    layers = []
    for f in (EXPERIMENTS_DIR / "base.yaml", EXPERIMENTS_DIR / "presets" / f"{preset}.yaml"):
        raw = OmegaConf.load(f)
        layers.append({k: raw[k] for k in ("drafter", "reader") if k in raw})
    cfg = merge(schema(), *layers, source=f"drafter preset {preset}")
    cfg.drafter.proposals = proposals
    return cfg.drafter, cfg.reader


def _old_generate_default() -> DictConfig:
    """sweeps.commands.generate's config for `--target default` before issue 45."""
    base = EXPERIMENTS_DIR / "base.yaml"
    return merge(schema(), OmegaConf.load(base), source=str(base))


def _old_overrides_only(overrides: Sequence[str]) -> DictConfig:
    """sweeps.commands.build_data, benchmarks.train, benchmarks.diagnostics.copy_probe and heldout_setup before issue 45."""
    cfg = merge(schema(), OmegaConf.from_dotlist(list(overrides)), source="command line")
    validate(cfg)
    return cfg


def _nest(dotted: dict[str, Any]) -> dict:
    out: dict = {}
    for key, value in dotted.items():
        *parents, last = str(key).split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
    return out


def _old_sweep(name: str, overrides: Sequence[str]) -> tuple[DictConfig, dict[str, DictConfig], dict[str, DictConfig]]:
    """sweeps.spec.load_sweep's configs before issue 45: (common, {baseline method: cfg}, {row label: cfg})."""
    from sweeps.spec import BASELINE_SET, SWEEP_KEYS, SweepSpec, format_label

    sweep_cli, config_cli = {}, {}
    for token in overrides:
        key = token.partition("=")[0]
        node: Any = OmegaConf.to_container(OmegaConf.from_dotlist([token]))
        for part in key.split("."):
            node = node[part]
        (sweep_cli if key in SWEEP_KEYS or key.startswith("search.") else config_cli)[key] = node
    spec_path = EXPERIMENTS_DIR / f"{name}.yaml"
    spec = OmegaConf.merge(OmegaConf.structured(SweepSpec), OmegaConf.load(spec_path))
    profile_name = sweep_cli.pop("profile", None) or spec.profile
    profile_raw = OmegaConf.load(EXPERIMENTS_DIR / "profiles" / f"{profile_name}.yaml") if profile_name else OmegaConf.create({})
    if profile_name:
        level = {k: v for k, v in OmegaConf.to_container(profile_raw).items() if k != "config"}
        if spec.search is None:
            level.pop("search", None)
        spec = OmegaConf.merge(spec, level)
    if sweep_cli:
        spec = OmegaConf.merge(spec, _nest(sweep_cli))
    layers = [OmegaConf.load(EXPERIMENTS_DIR / "base.yaml"), OmegaConf.load(EXPERIMENTS_DIR / "presets" / f"{spec.preset}.yaml"),
              _nest(OmegaConf.to_container(spec.config)),
              _nest(OmegaConf.to_container(profile_raw.get("config") or OmegaConf.create({}))), _nest(config_cli)]
    cfg = schema()
    for layer in layers:
        cfg = merge(cfg, layer)
    cfg.name = name
    validate(cfg)
    baselines = {}
    for m in spec.baselines:
        baselines[m] = merge(cfg, _nest(BASELINE_SET.get(m, {})))
    rows = {}
    if spec.grid is not None:
        keys = list(spec.grid["values"].keys())
        for combo in itertools.product(*(spec.grid["values"][k] for k in keys)):
            values = {k: (OmegaConf.to_container(v, resolve=False) if isinstance(v, (ListConfig, DictConfig)) else v)
                      for k, v in zip(keys, combo)}
            rows[format_label(spec.grid.label, values)] = values
    for v in spec.variants:
        values = dict(OmegaConf.to_container(v.set, resolve=False))
        rows[v.label or format_label("", values) or v.method] = values
    out = {}
    for label, values in rows.items():
        vcfg = merge(cfg, _nest(values))
        vcfg.name = f"{name}:{label}"
        validate(vcfg)
        out[label] = vcfg
    return cfg, baselines, out


# --- what is compared -----------------------------------------------------------------------------

def same(a: Any, b: Any) -> None:
    """Equal as written (interpolations kept) and as resolved, and both typed by the schema."""
    for x in (a, b):
        assert OmegaConf.get_type(x) is OmegaConf.get_type(a)
    assert OmegaConf.to_container(a, resolve=False) == OmegaConf.to_container(b, resolve=False)
    assert OmegaConf.to_container(a, resolve=True) == OmegaConf.to_container(b, resolve=True)


@pytest.fixture(autouse=True)
def _no_checkpoint_env(monkeypatch):
    """The paper preset reads two paths from the environment: compare it without them and with them."""
    monkeypatch.delenv("READY_TARGET_DIR", raising=False)
    monkeypatch.delenv("READY_DSPARK_DIR", raising=False)


def _launch(preset, config, overrides):
    """`python -m sweeps.commands.train_launch --preset P --config FILE a.b=v` (its main's call)."""
    return load_config(preset=preset, files=[config] if config else [], overrides=overrides)


def _train_scale(preset, profile, overrides):
    from benchmarks.train_scale import bench_config

    return bench_config(preset, profile, overrides)


def _engine(preset, proposals):
    from benchmarks.engine import drafter_configs

    return drafter_configs(preset, proposals)


def _generate_default():
    return load_config()  # sweeps.commands.generate's `--target default`


def _overrides_only(overrides):
    return load_config(overrides=overrides)  # sweeps.commands.build_data, benchmarks.train, copy_probe, heldout_setup


@pytest.mark.parametrize("preset", [None, *PRESETS])
@pytest.mark.parametrize("overrides", OVERRIDES)
def test_launch_presets_and_overrides(preset, overrides):
    same(_launch(preset, None, overrides), _old_launch(preset, None, overrides))


def test_launch_with_a_config_file(tmp_path: Path, monkeypatch):
    partial = tmp_path / "partial.yaml"
    partial.write_text("reader: {rank: 12, layers: [30]}\ntrain:\n  stage2: {samples: 9}\n")
    resolved = tmp_path / "resolved.yaml"  # what sweeps.torchrun hands its child processes
    OmegaConf.save(_old_launch("tiny", None, ["reader.rank=3", "seed=5"]), resolved, resolve=True)
    for preset, file, overrides in [(None, partial, []), ("tiny", partial, OVERRIDES[1]), ("qwen3_5_27b", partial, []),
                                    (None, resolved, []), (None, resolved, ["eval.max_new_tokens=9"])]:
        same(_launch(preset, str(file), overrides), _old_launch(preset, str(file), overrides))
    monkeypatch.setenv("READY_TARGET_DIR", "/models/q")
    same(_launch("qwen3_5_27b", None, []), _old_launch("qwen3_5_27b", None, []))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_train_scale_presets_profiles_and_overrides(preset, profile):
    for overrides in OVERRIDES[:2]:
        same(_train_scale(preset, profile, overrides), _old_train_scale(preset, profile, overrides))


@pytest.mark.parametrize("preset", PRESETS)
def test_engine_drafter_and_reader_sections(preset):
    for proposals in (3, 6):
        new, old = _engine(preset, proposals), _old_engine(preset, proposals)
        for a, b in zip(new, old):
            assert OmegaConf.to_container(a, resolve=False) == OmegaConf.to_container(b, resolve=False)
            assert OmegaConf.to_container(a, resolve=True) == OmegaConf.to_container(b, resolve=True)


def test_generate_default_and_the_override_only_commands():
    same(_generate_default(), _old_generate_default())
    assert OmegaConf.get_type(_generate_default()) is Config
    for overrides in OVERRIDES:
        same(_overrides_only(overrides), _old_overrides_only(overrides))


SWEEP_OVERRIDES = [[], ["profile=smoke"], ["profile=state_context", "reader.mlp_hidden=64"], ["preset=qwen3_5_27b"],
                   ["seeds=[0,1]", "eval.max_new_tokens=16", "target.dtype=bfloat16"]]


@pytest.mark.parametrize("name", sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml") if p.stem != "base"))
def test_every_sweep_row_resolves_as_before(name):
    from sweeps.spec import load_sweep, search_config

    for overrides in SWEEP_OVERRIDES:
        sweep = load_sweep(name, overrides)
        common, baselines, rows = _old_sweep(name, overrides)
        same(sweep.common, common)
        assert [b.method for b in sweep.baselines] == list(baselines)
        for b in sweep.baselines:
            same(b.cfg, baselines[b.method])
        assert {v.label.split(" = ")[0] for v in sweep.variants} <= set(rows)
        for v in sweep.variants:
            same(v.cfg, rows[v.label.split(" = ")[0]])
        if sweep.spec.search is not None:
            trial = search_config(sweep, {"train.loss.l1_weight": 0.3}, "t0")
            old = merge(common, {"train": {"loss": {"l1_weight": 0.3}}})
            old.name = f"{name}:t0"
            same(trial.cfg, old)


# --- the loader's own contract: one message per bad input, naming the file or key -----------------

@pytest.mark.parametrize("kwargs, message", [
    ({"preset": "nope"}, r"^preset 'nope' not found at .*presets/nope.yaml; expected one of \['local_checkpoint_template', "),
    ({"profile": "nope"}, r"^profile 'nope' not found at .*profiles/nope.yaml; expected one of \['gpu_shape', 'paper_recipe', "),
    ({"files": ["/no/such.yaml"]}, r"^config file /no/such.yaml does not exist; expected a YAML file of config keys"),
    ({"overrides": ["reader.rank"]}, r"^override 'reader.rank': expected KEY=VALUE \(e.g. reader.rank=16\)$"),
    ({"overrides": ["reader.layers=[30,"]}, r"^override 'reader.layers=\[30,': the value '\[30,' is not valid YAML"),
    ({"overrides": ["reader.rnak=3"]}, r"^command line: bad value at key 'reader.rnak': Key 'rnak' not in 'ReaderConfig'"),
    ({"overrides": ["reader.layers=30"]}, r"^command line: bad value at key 'reader.layers': expected a list \(e.g. \[30, 62\]\), got a scalar$"),
    ({"overrides": ["reader.rank=0"]}, r"^command line: bad value at key 'reader.rank': 0; expected a positive integer"),
    ({"preset": "tiny", "overrides": ["eval.top_p=0"]}, r"^command line: bad value at key 'eval.top_p': 0.0; expected "),
    ({"layers": [("row 'x'", {"reader": {"position": "middle"}})]}, r"^row 'x': bad value at key 'reader.position': 'middle'"),
    ({"overrides": ["drafter.confidence_head=true", "eval.verify_schedule=confidence", "eval.temperature=1"]},
     r"^.*base.yaml: bad value at key 'train.loss.confidence_temperature': 0.0; expected eval.temperature \(1.0\) "),
])
def test_a_bad_input_is_one_message_naming_it(kwargs, message):
    from ready.config import ConfigError

    with pytest.raises(ConfigError, match=message) as e:
        load_config(**kwargs)
    assert "\n" not in str(e.value)


def test_bad_files_are_named_with_what_was_expected(tmp_path: Path):
    from ready.config import ConfigError

    cases = {"broken.yaml": ("reader: {rank: [8\n", r"broken.yaml: not valid YAML: .*\(line \d+, column \d+\)"),
             "list.yaml": ("- 1\n- 2\n", r"list.yaml: expected a mapping at the top level"),
             "typo.yaml": ("train:\n  stage1: {smaples: 3}\n", r"typo.yaml: bad value at key 'train.stage1.smaples'"),
             "range.yaml": ("reader: {rank: -1}\n", r"range.yaml: bad value at key 'reader.rank': -1; expected ")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(files=[tmp_path / name])
    # a value set in a file and overridden on the command line is blamed on the command line
    with pytest.raises(ConfigError, match=r"^command line: bad value at key 'reader.rank'"):
        load_config(files=[tmp_path / "range.yaml"], overrides=["reader.rank=0"])
    assert load_config(files=[tmp_path / "range.yaml"], overrides=["reader.rank=4"]).reader.rank == 4


def test_a_retired_key_loads_at_its_old_value_and_is_refused_at_another():
    """`eval.use_kernels` left the schema (ready.config.RETIRED): a config stored before (a queued trial's)
    still loads, its key dropped; asking for another value says the key was removed and why."""
    from ready.config import ConfigError, to_container

    stored = to_container(load_config())
    stored["eval"]["use_kernels"] = True
    cfg = load_config(files=[("the stored config of job x", stored)], overrides=["eval.use_kernels=true"])
    assert "use_kernels" not in cfg.eval and to_container(cfg) == to_container(load_config())
    assert stored["eval"]["use_kernels"] is True  # the caller's layer is left as it was
    with pytest.raises(ConfigError, match=r"^command line: bad value at key 'eval.use_kernels': False; this key was "
                                          r"removed \(nothing read it"):
        load_config(overrides=["eval.use_kernels=false"])


def test_the_renamed_block_size_loads_as_proposals_with_one_line(capsys):
    """`drafter.block_size` (DSpark's, counting the anchor) was renamed `drafter.proposals` (K, the anchor not
    counted; ready.config.RENAMED): a config stored before (a queued trial's) loads with K = block_size - 1 and
    one line on stderr saying so, and drafts what it drafted before (base.yaml 8 -> 7, the 27B preset 7 -> 6)."""
    from ready.config import to_container

    stored = to_container(load_config())
    stored["drafter"]["block_size"] = stored["drafter"].pop("proposals") + 1
    assert stored["drafter"]["block_size"] == 8
    capsys.readouterr()
    cfg = load_config(files=[("the stored config of job x", stored)])
    assert cfg.drafter.proposals == 7 and "block_size" not in cfg.drafter
    assert to_container(cfg) == to_container(load_config())
    assert stored["drafter"]["block_size"] == 8  # the caller's layer is left as it was
    assert capsys.readouterr().err == ("config: the stored config of job x: drafter.block_size = 8 is read as "
                                       "drafter.proposals = 7 (DSpark's block_size counts the anchor; the config counts "
                                       "the tokens proposed per round, block_size = proposals + 1)\n")
    assert load_config(preset="qwen3_5_27b").drafter.proposals == 6
    assert load_config(preset="qwen3_5_27b", overrides=["drafter.block_size=7"]).drafter.proposals == 6


@pytest.mark.parametrize("overrides,message", [
    (["drafter.block_size=8", "drafter.proposals=7"], r"^command line: bad value at key 'drafter.block_size': 8; this key "
                                                      r"was renamed drafter.proposals \(.*\); expected drafter.proposals alone$"),
    (["drafter.block_size=eight"], r"^command line: bad value at key 'drafter.block_size': 'eight'; this key was renamed "
                                   r"drafter.proposals \(.*\); expected drafter.proposals = an integer$"),
    (["drafter.block_size=1"], r"^command line: bad value at key 'drafter.proposals': 0; expected an integer >= 1"),
])
def test_the_renamed_key_beside_the_new_one_or_out_of_range_is_one_message(overrides, message):
    from ready.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_a_profile_is_its_config_section_and_a_missing_base_yaml_is_the_schema(tmp_path: Path):
    from ready.config import ConfigError

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.yaml").write_text("config: {reader: {rank: 5}, train.stage1.lr: 0.5}\nseeds: [0]\n")
    (tmp_path / "profiles" / "bad.yaml").write_text("config: 3\n")
    cfg = load_config(profile="p", experiments_dir=tmp_path)  # no base.yaml here: the schema's defaults
    assert cfg.reader.rank == 5 and cfg.train.stage1.lr == 0.5
    assert OmegaConf.to_container(merge(cfg, {"reader": {"rank": 8}, "train": {"stage1": {"lr": schema().train.stage1.lr}}})) \
        == OmegaConf.to_container(schema())
    with pytest.raises(ConfigError, match=r"bad.yaml: bad value at key 'config': 3; expected a mapping of config keys"):
        load_config(profile="bad", experiments_dir=tmp_path)


def test_every_draft_layer_resolves_without_the_sweep_runner():
    cfg = load_config(overrides=["drafter.num_layers=3", "reader.inject_layers=${ready_range:${drafter.num_layers}}"])
    assert list(cfg.reader.inject_layers) == [0, 1, 2]


def test_entry_points_report_a_bad_preset_in_one_line(capsys):
    from benchmarks.engine import main as engine_main
    from sweeps.commands.train_launch import main as launch_main

    assert launch_main(["--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: preset 'nope' not found at ") and err.count("\n") == 1
    assert engine_main(["--target", "tiny", "target.device=cpu", "--drafter", "dspark", "--drafter-preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --drafter-preset 'nope': preset 'nope' not found at ") and err.count("\n") == 1


def test_the_confidence_schedule_needs_a_head_labelled_for_the_decoding_it_schedules():
    """A head trained here predicts the acceptance of its label's decoding (0 = greedy); the schedule
    thresholds that prediction, so it must be the evaluation's (and the label knows no nucleus cut). A
    checkpoint's head is used as loaded."""
    from ready.config import ConfigError

    head = ["drafter.confidence_head=true", "eval.verify_schedule=confidence"]
    assert load_config(overrides=[*head, "eval.temperature=1", "train.loss.confidence_temperature=1"])
    assert load_config(overrides=[*head, "eval.temperature=1", "drafter.checkpoint=/models/dspark"])
    assert load_config(overrides=[*head, "eval.temperature=1", "train.base.samples=0"])  # a head never trained
    assert load_config(overrides=["eval.temperature=1"])  # the full schedule never reads the head
    with pytest.raises(ConfigError, match=r"bad value at key 'eval.top_p': 0.9; expected 1 with eval.verify_schedule"):
        load_config(overrides=[*head, "eval.temperature=1", "train.loss.confidence_temperature=1", "eval.top_p=0.9"])
    assert load_config(overrides=[*head, "eval.top_p=0.9"])  # greedy: top_p is never read
