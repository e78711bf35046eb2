"""Each config section has one typed form, its dataclass in ready/config.py, and each default is written there
once: code below the loader gets the section as that dataclass (`ready.config.section`) and reads attributes,
so a key it leaves out takes the dataclass's default and a misspelled key is refused by name, never read as
the default (issue 76, item 2)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from ready.config import (Config, ConfigError, DrafterConfig, ReaderConfig, TrainConfig, load_config, schema,
                          section)

ROOT = Path(__file__).resolve().parent.parent


def test_a_section_of_a_loaded_config_is_its_dataclass_with_the_loaded_values():
    cfg = load_config(overrides=["reader.rank=16", "reader.inject_layers=${ready_range:${drafter.num_layers}}"])
    reader = section(ReaderConfig, cfg.reader)
    assert type(reader) is ReaderConfig  # resolved against the config it belongs to: every draft layer
    assert reader == dataclasses.replace(ReaderConfig(), rank=16, inject_layers=list(range(cfg.drafter.num_layers)))
    assert section(DrafterConfig, cfg.drafter) == DrafterConfig()


@pytest.mark.parametrize("kind, name", [(DrafterConfig, "drafter"), (ReaderConfig, "reader")])
def test_a_key_a_section_leaves_out_takes_the_dataclasss_default(kind, name):
    assert section(kind, {}) == kind()  # the one place each default is written
    assert section(kind, schema()[name]) == kind()  # the loader's schema is the dataclass
    given = kind()
    assert section(kind, given) == given and section(kind, given) is not given  # a copy, typed as a loaded one


def test_the_reader_rank_default_is_the_dataclasss_everywhere():
    """One default, read from the dataclass: the schema, base.yaml's restatement of it and a section that
    leaves the key out all give ReaderConfig's rank."""
    rank = ReaderConfig().rank
    assert schema().reader.rank == rank and load_config().reader.rank == rank
    assert section(ReaderConfig, {"enabled": True}).rank == rank
    assert section(Config, {"reader": {"enabled": True}}).reader.rank == rank


@pytest.mark.parametrize("kind, value, key, message", [
    (DrafterConfig, {"haed": "gated"}, "ready_drafter.drafter",
     "x.json: unknown key 'ready_drafter.drafter.haed' (did you mean 'ready_drafter.drafter.head'?); expected one "
     "of DrafterConfig's keys: " + ", ".join(f.name for f in dataclasses.fields(DrafterConfig))),
    (ReaderConfig, {"rank": 8, "nonsense": 1}, "reader",
     "x.json: unknown key 'reader.nonsense'; expected one of ReaderConfig's keys: "
     + ", ".join(f.name for f in dataclasses.fields(ReaderConfig))),
    (TrainConfig, {"stage1": {"lrr": 1e-3}}, "train",
     "x.json: unknown key 'train.stage1.lrr' (did you mean 'train.stage1.lr'?); expected one of StageConfig's keys: "
     "samples, lr, batch_size, warmup, weight_decay, grad_clip, anchors_per_sample"),
    (DrafterConfig, {"head_rank": "abc"}, "ready_drafter.drafter",
     "x.json: bad value at key 'ready_drafter.drafter.head_rank': 'abc'; expected an integer"),
    (ReaderConfig, {"layers": None}, "reader",
     "x.json: bad value at key 'reader.layers': field 'layers' is not Optional"),
    (ReaderConfig, ["rank", 8], "reader", "x.json: bad value at key 'reader': ['rank', 8]; expected a mapping of "
                                          "ReaderConfig's keys"),
])
def test_an_unknown_or_mistyped_key_is_one_line_naming_its_full_path(kind, value, key, message):
    with pytest.raises(ConfigError) as e:
        section(kind, value, "x.json", key)
    assert str(e.value) == message and "\n" not in str(e.value)


# --- no second default in the code -----------------------------------------------------------------

def keys_of(node: object) -> set[str]:
    """Every key of a config section and of the sections nested in it."""
    keys = set()
    for f in dataclasses.fields(node):
        keys.add(f.name)
        if dataclasses.is_dataclass(getattr(node, f.name)):
            keys |= keys_of(getattr(node, f.name))
    return keys


SECTION_KEYS = keys_of(Config())  # every key of every section
DRAFTER_KEYS = keys_of(DrafterConfig()) | keys_of(ReaderConfig())


def redefaults(text: str, where: str, keys: set[str]) -> list[str]:
    """`x.get("key", default)`, `x.get("key") or default` and `getattr(x, "key", default)` in the Python source
    `text`, with `key` in `keys`: a default written a second time."""
    tree = ast.parse(text)
    ored = {id(v) for n in ast.walk(tree) if isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or)
            for v in n.values[:-1]}
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f, args = n.func, n.args
        if isinstance(f, ast.Attribute) and f.attr == "get" and args and isinstance(args[0], ast.Constant):
            key, defaulted = args[0].value, len(args) > 1 or id(n) in ored
        elif isinstance(f, ast.Name) and f.id == "getattr" and len(args) == 3 and isinstance(args[1], ast.Constant):
            key, defaulted = args[1].value, True
        else:
            continue
        if defaulted and key in keys:
            found.append((n.lineno, f"{where}:{n.lineno}: {ast.get_source_segment(text, n)}"))
    return [hit for _, hit in sorted(found)]


def test_no_module_of_the_drafter_reader_or_training_writes_a_config_default_again():
    own = [ROOT / "ready" / "reader.py", *sorted((ROOT / "ready" / "drafter").rglob("*.py")),
           *sorted((ROOT / "ready" / "train").rglob("*.py"))]
    scan = lambda path, keys: redefaults(path.read_text(), str(path.relative_to(ROOT)), keys)  # noqa: E731
    found = [hit for path in own for hit in scan(path, SECTION_KEYS)]
    found += [hit for path in sorted((ROOT / "ready").rglob("*.py")) if path not in own  # the drafter's and the
              for hit in scan(path, DRAFTER_KEYS) if ".get(" in hit]  # reader's keys anywhere in the library
    assert not found, "a config default written a second time (read the typed section's attribute):\n" + "\n".join(found)


def test_the_scan_sees_the_forms_a_second_default_takes():
    lines = ['d.get("layer_space", "paper")', 'd.get("rope_scaling") or {}', 'getattr(cfg.train, "length_buckets", 0)',
             'scaling.get("factor")', 'getattr(cfg.train, "stage1")', 'raw.get("hidden_act", "silu")']
    hits = redefaults("\n".join(lines) + "\n", "probe.py", SECTION_KEYS)
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3"]  # the first three lines, not the last three
