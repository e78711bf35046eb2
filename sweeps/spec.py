"""Load a sweep spec and expand it into resolved, hashed variants.

Every config here (the common one, each row's, each baseline's, each search trial's) is the output
of the one library loader, `ready.config.load_config` (unknown keys and bad types fail with the key's
full path and the layer that set it; `ready.config.validate` checks ranges), on these layers:

    schema <- experiments/base.yaml <- experiments/presets/<preset>.yaml
           <- experiments/<sweep>.yaml `config:` <- experiments/profiles/<profile>.yaml `config:`
           <- CLI `a.b=v` <- the variant's own values

A spec declares its rows either as a `grid` (cartesian product of declared values, a label
template) or as an explicit `variants` list; each row gets a label and a row order and is run
once per seed. The baselines (AR, DSpark) are rows too, evaluated once per sweep setting.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from ready.config import (EXPERIMENTS_DIR, SEED_MAX, SEED_RANGE, ConfigError, Layer, blame, clean_message, config_hash,
                          exact_mode, layer_keys, load_config, merge, nest, parse_override, read_yaml, restore_retired,
                          seed_ok, to_container, yaml_problem)
from ready.data.corpus import CorpusError
from ready.loading import inputs_identity

METHODS = ("ar", "dspark", "dflash", "ft", "placebo", "ready")
# rows a sweep evaluates once per setting (and seed) beside its own rows: the references its
# gains are measured against, and the controls that separate their causes; dflash is DSpark's base
# drafter without the Markov head (the baseline SpecForge, DeepSpec and z-lab/dflash report)
BASELINE_LABELS = {"ar": "AR", "dspark": "DSpark", "dflash": "DFlash", "ft": "DSpark + FT",
                   "placebo": "Placebo (shuffled states)"}
# dflash: a confidence head (if any) reads the hidden states only, as there is no Markov embedding
BASELINE_SET = {"dflash": {"drafter.head": "none", "drafter.confidence_with_markov": False}, "ft": {"reader.enabled": False},
                "placebo": {"reader.enabled": True, "reader.states": "shuffled"}}
REPLICATE = ("all", "adaptation")
SWEEP_KEYS = ("preset", "profile", "seeds", "replicate")  # CLI keys that set the sweep, not the run config
ROW_SECTIONS = ("grid", "variants", "search")  # a spec declares its rows in at least one of these
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a file name in experiments/, no folder, no '..'


class SpecError(ConfigError):
    """A sweep spec, preset, profile or override is wrong; the message names the file and key."""


# ---------------------------------------------------------------------------------------------
# Spec files (typed, closed: an unknown spec-level key fails like an unknown config key)


@dataclass
class GridSpec:
    """Cartesian product of declared values; `label` formats a row, e.g. `r={reader.rank}`."""

    values: dict[str, list[Any]] = field(default_factory=dict)
    label: str = ""
    method: str = "ready"


@dataclass
class VariantSpec:
    """One explicit row: its label, the method it stands for and the config keys it sets."""

    label: str = ""
    method: str = "ready"
    set: dict[str, Any] = field(default_factory=dict)  # dotted keys, e.g. {reader.enabled: false}


@dataclass
class SearchParamSpec:
    low: float = 0.0
    high: float = 1.0
    log: bool = False


@dataclass
class SearchSpec:
    """A TPE search over continuous knobs (the rows are the trials)."""

    n_trials: int = 0
    # an MLflow metric name of the child runs; the default is measured on held-out regenerated
    # sequences (validation split), never on the evaluation suites
    objective: str = "heldout_tf/tau"
    direction: str = "maximize"
    sampler_seed: int = 0
    params: dict[str, SearchParamSpec] = field(default_factory=dict)  # dotted config key -> range
    start: dict[str, Any] = field(default_factory=dict)  # first trial's values (e.g. the paper's)


@dataclass
class SweepSpec:
    """A sweep file: which table it fills, the model preset, seeds and its rows."""

    table: str = ""  # table1 .. table6; empty for searches
    description: str = ""
    preset: str = "tiny"
    profile: Optional[str] = None
    seeds: list[int] = field(default_factory=lambda: [0])
    # all: seed s re-trains everything random a row depends on, the base DSpark drafter included
    # (train.base_seed = s, one base drafter per seed shared by that seed's rows); adaptation:
    # seeds re-run only the two adaptation stages on one base drafter (train.base_seed as set)
    replicate: str = "all"
    # ar (speedups), dspark (the gains' reference), dflash (DSpark's base drafter without the Markov head,
    # drafter.head: none; opt-in), ft (same two stages, reader off: separates state access from extra
    # fine-tuning), placebo (reader on another sequence's states: separates state information from
    # adapter capacity)
    baselines: list[str] = field(default_factory=lambda: ["ar", "dspark", "ft", "placebo"])
    config: dict[str, Any] = field(default_factory=dict)  # overrides shared by every row
    # setting axes: config key -> values; `python -m sweeps.run NAME` runs the whole sweep (baselines
    # included) once per combination, each its own sweep setting, as `NAME key=value` would (e.g.
    # eval.verify_schedule: [full, confidence]); a command-line override of an axis key runs that value alone
    axes: dict[str, list[Any]] = field(default_factory=dict)
    grid: Optional[GridSpec] = None
    variants: list[VariantSpec] = field(default_factory=list)
    search: Optional[SearchSpec] = None


# ---------------------------------------------------------------------------------------------
# Resolved sweep


@dataclass
class Variant:
    """One row of a table: a method with a fully resolved config (without the seed)."""

    label: str
    order: int
    method: str
    cfg: DictConfig
    variant_id: str  # hash of the config without the seed
    swept: dict[str, Any] = field(default_factory=dict)  # the keys this row sets, for the table
    replicate: str = "all"  # what a seed re-trains (SweepSpec.replicate)

    def job(self, seed: int) -> "Job":
        cfg = self.cfg.copy()
        cfg.seed = seed
        if self.replicate == "all":  # the base drafter is one more random thing the row depends on
            cfg.train.base_seed = seed
        return Job(variant=self, seed=seed, cfg=cfg, config_hash=job_hash(cfg, self.method))


@dataclass
class Job:
    """One (variant, seed): what a worker trains and evaluates; `config_hash` names its run."""

    variant: Variant
    seed: int
    cfg: DictConfig
    config_hash: str

    @property
    def label(self) -> str:
        return self.variant.label


@dataclass(frozen=True)
class SweepInputs:
    """A sweep's arguments to `ready.config.load_config`: its rows' configs are that loader's output for
    these plus the row's own layer (sweep spec `config:` between the preset and the profile)."""

    preset: str
    profile: Optional[str]
    spec_path: str
    config: dict  # the spec's `config:`, nested
    overrides: list[str]  # the command line's `a.b=v` tokens that set the run config
    experiments_dir: str


@dataclass
class Sweep:
    name: str
    spec: SweepSpec
    preset: str
    profile: Optional[str]
    seeds: list[int]
    common: DictConfig  # the config every row starts from (after CLI overrides)
    setting: str  # `setting_hash`: one Optuna study and one baseline set per setting
    baselines: list[Variant]
    variants: list[Variant]
    overrides: list[str]
    inputs: SweepInputs  # what `ready.config.load_config` resolves every row of this sweep from

    @property
    def table(self) -> str:
        return self.spec.table

    @property
    def rows(self) -> list[Variant]:
        return self.baselines + self.variants

    def jobs(self) -> list[Job]:
        """Every row once per seed, seed by seed: the rows of one seed train on the same batches, so a
        worker that runs them one after another asks the frozen target each question once
        (ready.train.teacher_pass). Within a seed: AR and DSpark, the variants but the last, the two
        controls (the no-state control after the rows whose passes serve it), then the last variant.
        Two workers start neighbouring jobs together, so a last variant that resolves to the same
        drafter as the one before it (the rank clamped at d_k: r=64 and r=128 on the embedded default)
        starts after that one has finished and reuses its drafter instead of training it beside it."""
        out: list[Job] = []
        seen: set[str] = set()
        controls = [r for m in ("placebo", "ft") for r in self.baselines if r.method == m]
        first = [r for r in self.baselines if r not in controls]
        order = first + self.variants[:-1] + controls + self.variants[-1:]
        for seed in self.seeds:
            for row in order:
                job = row.job(seed)
                if job.config_hash not in seen:  # AR ignores the seed: one run serves every seed
                    seen.add(job.config_hash)
                    out.append(job)
        return out

    def jobs_in_table_order(self) -> list[Job]:
        """`jobs()` row by row (the table's order), each row's seeds in order: for listings."""
        return sorted(self.jobs(), key=lambda j: (j.variant.order, j.seed))


# ---------------------------------------------------------------------------------------------
# Hashing: a variant is a pure function of its config; knobs that cannot change a result are
# left out, and a baseline ignores the sections it never uses.

# train.devices, train.micro_batch_size: the same result up to rounding, at another speed or memory;
# train.teacher_memo_gb: a kept teacher pass is the very tensors a fresh one computes
_NEVER_HASHED = ("name", "artifacts_dir", "train.devices", "train.micro_batch_size", "train.teacher_memo_gb")
# knobs added after rows were run: at these values every earlier row ran the same, so they are left
# out and earlier rows keep their hashes
_DEFAULT_NOT_HASHED = {"eval.concurrency": 1, "target.attention_window": 0, "pretrain.repeat_fraction": 0.0,
                       "regen.temperature": 0.0, "regen.top_p": 1.0, "data.path": None, "data.format": "auto",
                       "data.on_error": "stop", "data.responses": "regenerate", "train.length_buckets": 0,
                       "target.compile": "auto", "bench.turns": "first", "eval.verify_schedule": "full",
                       "eval.confidence_threshold": 0.5, "eval.verify_budget": 0.0, "train.loss.confidence_weight": 1.0,
                       # every head trained before the knob was labelled at temperature 1 (DeepSpec's label)
                       "train.loss.confidence_temperature": 1.0}
# the confidence head's label (train.loss.confidence_temperature, its default 0 since): hashed only where the
# base drafter trains a head (drafter.confidence_head, no drafter.checkpoint) at another temperature than 1,
# so the rows without a head keep their hashes, and so do those whose head keeps DeepSpec's label
_TRAINED_HEAD_ONLY = "train.loss.confidence_temperature"
_UNUSED_BY = {
    "ar": ("drafter", "reader", "train", "regen", "seed"),
    "dspark": ("reader", "train.stage1", "train.stage2", "train.lora", "seed"),  # uses train.base_seed
    "dflash": ("reader", "train.stage1", "train.stage2", "train.lora", "seed"),  # likewise
    "ft": (),
    "placebo": (),
    "ready": (),
}


def setting_hash(name: str, cfg: DictConfig) -> str:
    """A sweep setting: the sweep, its common config and what the runs are made from beside it (the corpus,
    a checkpoint's weights: `ready.loading.inputs_identity`). Runs are reused and paired only within one
    setting, so a table never mixes rows of two targets that one config built from two corpora."""
    try:
        made_from = inputs_identity(cfg)
    except CorpusError as e:  # the pinned corpus package is missing or another version: one line
        raise SpecError(str(e)) from None
    return config_hash({"sweep": name, "common": canonical(cfg, "ready"), "made_from": made_from})


def _drop(tree: dict, dotted: str) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for p in parents:
        node = node.get(p, {})
    node.pop(last, None)


def canonical(cfg: DictConfig, method: str) -> dict:
    """The part of a resolved config that decides a `method` run's result (what is hashed)."""
    tree = to_container(cfg)
    for key in _NEVER_HASHED + _UNUSED_BY[method]:
        _drop(tree, key)
    for key, default in _DEFAULT_NOT_HASHED.items():
        if OmegaConf.select(cfg, key) == default:
            _drop(tree, key)
    if not OmegaConf.select(cfg, "drafter.confidence_head") or OmegaConf.select(cfg, "drafter.checkpoint"):
        _drop(tree, _TRAINED_HEAD_ONLY)  # no head trained here: its label's temperature changes nothing
    if tree.get("data") == {}:  # training on the corpus prompts, as every row before data.path
        tree.pop("data")
    restore_retired(tree)  # keys removed from the schema hash at the value every earlier row had
    if "eval" in tree:  # auto / on / true name the same decoding (a float32 auto row hashes as before: false)
        tree["eval"]["exact"] = exact_mode(cfg)
    drafter = tree.get("drafter")
    if drafter is not None and drafter.get("head") == "none":  # no Markov head: its rank changes nothing
        drafter.pop("head_rank", None)
    if drafter is not None and drafter.get("checkpoint"):  # what the rows start from: its contents, not its path
        drafter["checkpoint"] = checkpoint_id(drafter["checkpoint"])
    reader = tree.get("reader")
    if reader is not None:  # -1 and num_layers-1 name the same draft layer
        n = tree["drafter"]["num_layers"]
        reader["inject_layers"] = sorted({int(i) % n for i in reader["inject_layers"]})
    return {"method": method, "config": tree}


def checkpoint_id(path: str) -> str:
    """`drafter.checkpoint` as it enters a row's hash: the folder's content digest."""
    from ready.drafter.checkpoint import DrafterError, is_drafter_folder, content_digest

    if not is_drafter_folder(path):
        raise ConfigError(f"bad value at key 'drafter.checkpoint': {path!r} is not a drafter folder; expected a DSpark "
                          "folder (config.json with dflash_config + model.safetensors)")
    try:
        return "sha256:" + content_digest(path)
    except DrafterError as e:  # its index names a file outside the folder, or none
        raise ConfigError(f"bad value at key 'drafter.checkpoint': {e}") from None


def variant_hash(cfg: DictConfig, method: str) -> str:
    tree = canonical(cfg, method)
    tree["config"].pop("seed", None)
    return config_hash(tree)


def job_hash(cfg: DictConfig, method: str) -> str:
    return config_hash(canonical(cfg, method))


# ---------------------------------------------------------------------------------------------
# Loading


def _merge(base: DictConfig, layer: Any, source: str) -> DictConfig:
    try:
        return merge(base, layer, source=source)
    except ConfigError as e:
        raise SpecError(clean_message(str(e))) from None


def _read_yaml(path: Path, what: str) -> DictConfig:
    try:
        return read_yaml(path, what)
    except ConfigError as e:
        raise SpecError(str(e)) from None


def _load(sweep: "SweepInputs", layers: Sequence[Layer]) -> DictConfig:
    """A config of this sweep (its common config, a row's, a baseline's, a search trial's): the one
    library loader (`ready.config.load_config`) on the sweep's layers and then `layers`."""
    try:
        return load_config(preset=sweep.preset, profile=sweep.profile, files=[(sweep.spec_path, sweep.config)],
                           overrides=sweep.overrides, layers=layers, experiments_dir=sweep.experiments_dir)
    except ConfigError as e:
        raise SpecError(clean_message(str(e))) from None


def _sweep_spec(raw: Any, source: str) -> DictConfig:
    return _merge(OmegaConf.structured(SweepSpec), raw, source)


def parse_overrides(overrides: Sequence[str]) -> tuple[dict, dict]:
    """Split CLI `a.b=v` tokens into sweep-level settings and config overrides (YAML values)."""
    sweep: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for token in overrides:
        try:
            key, node = parse_override(token)
        except ConfigError as e:
            raise SpecError(str(e)) from None
        if key in SWEEP_KEYS or key.startswith("search."):
            sweep[key] = node
        else:
            config[key] = node
    return sweep, config


def _config_tokens(overrides: Sequence[str]) -> list[str]:
    """The `a.b=v` tokens that set the run config (not the sweep: preset, profile, seeds, ...)."""
    keys = [token.partition("=")[0] for token in overrides]
    return [t for t, k in zip(overrides, keys) if not (k in SWEEP_KEYS or k.startswith("search."))]


def list_sweeps(experiments_dir: Path = EXPERIMENTS_DIR) -> dict[str, str]:
    """Sweep name -> its one-line description, from `experiments/*.yaml` (not base.yaml).

    A file that does not parse is listed with its problem instead of breaking the listing."""
    out = {}
    for path in sorted(Path(experiments_dir).glob("*.yaml")):
        if path.stem == "base":
            continue
        try:
            raw = OmegaConf.load(path)
            if not isinstance(raw, DictConfig):
                raise ValueError("expected a mapping at the top level")
            if not any(k in raw for k in ROW_SECTIONS):  # e.g. an empty file: not a sweep at all
                raise ValueError(f"{'the file is empty' if len(raw) == 0 else 'declares no rows'}; expected "
                                 "a 'grid', 'variants' or 'search' section")
            out[path.stem] = f"{raw.get('table', '') or 'search'}: {raw.get('description', '')}".strip()
        except Exception as e:
            out[path.stem] = f"BROKEN {path.name}: {yaml_problem(e)}"
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple, ListConfig)):
        return "{" + ",".join(_fmt(v) for v in value) + "}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_label(template: str, values: dict[str, Any]) -> str:
    """`r={reader.rank}` with {"reader.rank": 8} -> `r=8`; lists print as sets, `{30,62}`."""
    if not template:
        return ", ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in values.items())

    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key not in values:
            raise SpecError(f"grid.label: '{{{key}}}' is not a swept key; expected one of {sorted(values)}")
        return _fmt(values[key])

    return re.sub(r"\{([\w.]+)\}", sub, template)


def _rows(spec: DictConfig, source: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, method, dotted overrides) per declared row, in row order."""
    rows: list[tuple[str, str, dict[str, Any]]] = []
    if spec.grid is not None:
        keys = list(spec.grid["values"].keys())
        if not keys:  # itertools.product() of nothing is one row that sets nothing
            raise SpecError(f"{source}: bad value at key 'grid.values': empty; expected at least one config key with "
                            "a non-empty list of values to sweep (e.g. reader.rank: [8, 16])")
        for key in keys:
            vals = spec.grid["values"][key]
            if not isinstance(vals, ListConfig) or len(vals) == 0:
                raise SpecError(f"{source}: grid.values.{key}: expected a non-empty list of values to sweep")
        for combo in itertools.product(*(spec.grid["values"][k] for k in keys)):
            values = {k: (OmegaConf.to_container(v, resolve=False) if isinstance(v, (ListConfig, DictConfig)) else v)
                      for k, v in zip(keys, combo)}
            rows.append((format_label(spec.grid.label, values), spec.grid.method, values))
    for i, v in enumerate(spec.variants):
        values = dict(OmegaConf.to_container(v.set, resolve=False))  # interpolations resolve per row
        rows.append((v.label or format_label("", values) or v.method, v.method, values))
    _check_unique_labels(rows, len(rows) - len(spec.variants), source)
    return rows


def _check_unique_labels(rows: list[tuple[str, str, dict[str, Any]]], n_grid: int, source: str) -> None:
    """Refuse two declared rows with one label (a table would print them as one row, twice);
    the first `n_grid` rows come from `grid` (key `grid.label`), the rest from `variants`."""
    seen: dict[str, str] = {}
    for i, (label, _, _) in enumerate(rows):
        key = "grid.label" if i < n_grid else f"variants[{i - n_grid}].label"
        if label in seen:
            raise SpecError(f"{source}: bad value at key '{key}': label {label!r} is already used by "
                            f"'{seen[label]}'; expected a unique label per row")
        seen[label] = key


def axis_settings(name: str, overrides: Sequence[str] = (),
                  experiments_dir: Path | str = EXPERIMENTS_DIR) -> list[list[str]]:
    """The command lines (`overrides` plus one `key=value` per axis) of every setting a run of sweep `name`
    covers: one per combination of its `axes` values, an axis set on the command line held at that value;
    [overrides] for a sweep without axes."""
    spec_path = Path(experiments_dir) / f"{name}.yaml"
    if name == "base" or not spec_path.is_file():
        return [list(overrides)]
    spec = _sweep_spec(_read_yaml(spec_path, "sweep"), str(spec_path))
    given = {token.partition("=")[0] for token in overrides}
    axes = {k: list(v) for k, v in (OmegaConf.to_container(spec.axes) or {}).items() if k not in given}
    for key, values in axes.items():
        if not values:
            raise SpecError(f"{spec_path}: bad value at key 'axes.{key}': empty; expected a non-empty list of values")
    combos = itertools.product(*axes.values())
    return [list(overrides) + [f"{k}={_fmt(v)}" for k, v in zip(axes, combo)] for combo in combos]


def load_sweep(name: str, overrides: Sequence[str] = (), experiments_dir: Path | str = EXPERIMENTS_DIR) -> Sweep:
    """Read `experiments/<name>.yaml`, merge every layer, and expand it into resolved rows."""
    root = Path(experiments_dir)
    if not SWEEP_NAME.fullmatch(name):  # it names the run folder (runs/<name>) and the MLflow experiment
        raise SpecError(f"sweep {name!r}: a sweep name is a name, not a path; expected one of "
                        f"{sorted(list_sweeps(root))} (the files experiments/<name>.yaml)")
    spec_path = root / f"{name}.yaml"
    if name == "base" or not spec_path.is_file():
        raise SpecError(f"sweep '{name}' not found in {root}; expected one of {sorted(list_sweeps(root))}")
    sweep_cli, config_cli = parse_overrides(overrides)

    spec = _sweep_spec(_read_yaml(spec_path, "sweep"), str(spec_path))
    profile_name = sweep_cli.pop("profile", None) or spec.profile
    profile_path = root / "profiles" / f"{profile_name}.yaml"
    profile_raw = _read_yaml(profile_path, "profile") if profile_name else OmegaConf.create({})
    if profile_name:
        _sweep_spec(profile_raw, str(profile_path))  # unknown keys fail here, with the file named
        sweep_level = {k: v for k, v in OmegaConf.to_container(profile_raw).items() if k != "config"}
        if spec.search is None:
            sweep_level.pop("search", None)  # a profile's trial budget only matters to searches
        spec = _merge(spec, sweep_level, str(profile_path))
    if sweep_cli:
        spec = _merge(spec, nest(sweep_cli), "command line")
    for method in spec.baselines:
        if method not in BASELINE_LABELS:
            raise SpecError(f"{spec_path}: bad value at key 'baselines': {method!r}; expected some of "
                            f"{', '.join(BASELINE_LABELS)}")
    if spec.replicate not in REPLICATE:
        raise SpecError(f"{spec_path}: bad value at key 'replicate': {spec.replicate!r}; expected 'all' (seeds "
                        "re-train the base drafter too) or 'adaptation' (seeds re-run the two stages only)")
    seeds_from = ("command line" if "seeds" in sweep_cli else
                  str(profile_path) if profile_name and "seeds" in profile_raw else str(spec_path))
    if not spec.seeds:
        raise SpecError(f"{seeds_from}: bad value at key 'seeds': empty; expected a list of integer seeds")
    for seed in spec.seeds:  # the rows' `seed` and `train.base_seed`: refused here, before any row is made
        if not seed_ok(seed):
            raise SpecError(f"{seeds_from}: bad value at key 'seeds': {seed}; expected integer seeds in [0, {SEED_MAX}]")
    if spec.search is not None and not seed_ok(spec.search.sampler_seed):
        raise SpecError(f"{spec_path}: bad value at key 'search.sampler_seed': {spec.search.sampler_seed}; expected "
                        f"{SEED_RANGE}")

    inputs = SweepInputs(preset=str(spec.preset), profile=profile_name, spec_path=str(spec_path),
                         config=nest(OmegaConf.to_container(spec.config)), overrides=_config_tokens(overrides),
                         experiments_dir=str(root))
    named = (str(spec_path), {"name": name})
    cfg = _load(inputs, [named])
    if cfg.drafter.checkpoint:  # checked before any row hashes it, blamed on the layer that set it
        preset_path = root / "presets" / f"{spec.preset}.yaml"
        set_by = [(str(preset_path), layer_keys(_read_yaml(preset_path, "preset"))),
                  (str(spec_path), layer_keys(inputs.config)),
                  (str(profile_path), layer_keys(profile_raw.get("config") or {})),
                  ("command line", set(config_cli))]
        try:
            checkpoint_id(str(cfg.drafter.checkpoint))
        except ConfigError as e:
            raise SpecError(f"{blame('drafter.checkpoint', set_by, str(spec_path))}: {e}") from None

    rows = _rows(spec, str(spec_path))
    swept = {k for _, _, values in rows for k in values}
    crossed = sorted(swept & set(OmegaConf.to_container(spec.axes) or {}))
    if crossed:
        raise SpecError(f"{spec_path}: '{crossed[0]}' is both a setting axis and swept by the rows; expected one of them")
    clash = sorted(swept & set(config_cli))
    if clash:
        raise SpecError(f"command line: '{clash[0]}' is swept by sweep '{name}'; remove the override or edit {spec_path}")

    baselines = []
    for i, m in enumerate(spec.baselines):
        where = f"{spec_path} (baseline '{m}')"
        bcfg = _load(inputs, [named, (where, nest(BASELINE_SET.get(m, {})))])
        baselines.append(Variant(label=BASELINE_LABELS[m], order=i, method=m, cfg=bcfg, variant_id=variant_hash(bcfg, m),
                                 replicate=spec.replicate))
    variants: list[Variant] = []
    by_id: dict[str, Variant] = {}
    for i, (label, method, values) in enumerate(rows):
        if method not in ("ready", "ft"):
            raise SpecError(f"{spec_path}: row '{label}': bad method {method!r}; expected 'ready' or 'ft' "
                            f"(the others are baselines: {', '.join(BASELINE_LABELS)})")
        where = f"{spec_path} (row '{label}')"
        vcfg = _load(inputs, [named, (where, {**nest(values), "name": f"{name}:{label}"})])
        try:
            vid = variant_hash(vcfg, method)
        except ConfigError as e:  # a row's own drafter.checkpoint that is not a drafter folder
            raise SpecError(f"{where}: {e}") from None
        if vid in by_id:  # e.g. {0,last} and "all" on a 2-layer drafter: one run, both labels
            by_id[vid].label += f" = {label}"
            continue
        row = Variant(label=label, order=len(baselines) + i, method=method, cfg=vcfg, variant_id=vid, swept=values,
                      replicate=spec.replicate)
        by_id[vid] = row
        variants.append(row)
    if spec.search is not None:
        _check_search(spec.search, cfg, str(spec_path))
    if not variants and spec.search is not None and spec.search.n_trials <= 0:  # a search of no trials
        in_profile = layer_keys(profile_raw.get("search") or {}, "search.") if profile_raw.get("search") else set()
        where = blame("search.n_trials", [(str(profile_path), in_profile), ("command line", set(sweep_cli))],
                      str(spec_path))
        raise SpecError(f"{where}: bad value at key 'search.n_trials': {spec.search.n_trials}; expected an integer "
                        ">= 1 (the search's trials are this sweep's only rows)")
    if not variants and spec.search is None:
        raise SpecError(f"{spec_path}: declares no rows; expected a 'grid', 'variants' or 'search' section")

    return Sweep(name=name, spec=spec, preset=spec.preset, profile=profile_name, seeds=list(spec.seeds),
                 common=cfg, setting=setting_hash(name, cfg),
                 baselines=baselines, variants=variants, overrides=list(overrides), inputs=inputs)


def _check_search(search: DictConfig, cfg: DictConfig, source: str) -> None:
    if search.direction not in ("maximize", "minimize"):
        raise SpecError(f"{source}: bad value at key 'search.direction': {search.direction!r}; expected 'maximize' or 'minimize'")
    for key, rng in search.params.items():
        if OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
            raise SpecError(f"{source}: bad key at 'search.params.{key}': not a config key")
        if not rng.low < rng.high or (rng.log and rng.low <= 0):
            raise SpecError(f"{source}: bad range at 'search.params.{key}': expected 0 < low < high for a log range, low < high otherwise")


def search_config(sweep: Sweep, params: dict[str, Any], label: str) -> Variant:
    """The row a search trial stands for: the sweep's config with the trial's values."""
    where = f"search trial '{label}'"
    vcfg = _load(sweep.inputs, [(sweep.inputs.spec_path, {"name": sweep.name}),
                                (where, {**nest(params), "name": f"{sweep.name}:{label}"})])
    return Variant(label=label, order=100 + len(sweep.variants), method="ready", cfg=vcfg,
                   variant_id=variant_hash(vcfg, "ready"), swept=dict(params), replicate=str(sweep.spec.replicate))
