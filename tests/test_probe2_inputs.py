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
