"""Each config section has one typed form, its dataclass in ready/config.py, and each default is written there
once: code below the loader gets the section as that dataclass (`ready.config.section`) and reads attributes,
so a key it leaves out takes the dataclass's default and a misspelled key is refused by name, never read as
the default (issue 76, item 2)."""

from __future__ import annotations

import dataclasses

import pytest

from ready.config import (Config, ConfigError, DrafterConfig, ReaderConfig, TrainConfig, load_config, schema,
                          section)


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
