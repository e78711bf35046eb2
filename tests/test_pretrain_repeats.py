"""Repeated spans for the tiny target's pretraining (`pretrain.repeat_fraction`): windows get a span
of their own text repeated further on, plain windows stay plain, and the knob is validated (at 0 it
changes no cache key: tests/test_data_default.py, tests/test_sweeps_spec.py)."""

from __future__ import annotations

import pytest
import torch

from ready.config import ConfigError, merge, schema, validate
from ready.data.pretrain import insert_repeats


def test_no_fraction_changes_nothing():
    w = torch.arange(600).view(3, 200)
    assert torch.equal(insert_repeats(w, 0.0, torch.Generator().manual_seed(0)), w)


def test_every_row_gets_one_earlier_span_copied_within_the_gap():
    w = torch.arange(1000).view(5, 200)  # distinct tokens: a copied token shows where it came from
    out = insert_repeats(w, 1.0, torch.Generator().manual_seed(1), span=(8, 48), max_gap=64)
    for row, orig in zip(out, w):
        moved = (row != orig).nonzero().flatten()
        assert 8 <= moved.numel() <= 48 and torch.equal(moved, torch.arange(moved[0], moved[-1] + 1))
        d, n = int(moved[0]), moved.numel()
        s = int(row[d] - orig[0])  # the source span starts where the copied token was
        assert torch.equal(row[d:d + n], orig[s:s + n])
        assert 0 <= d - (s + n) <= 64  # it begins 0..max_gap tokens after the source ends


def test_the_knob_is_validated():  # left out of row hashes at 0: tests/test_sweeps_spec.py
    cfg = merge(schema(), {})
    assert cfg.pretrain.repeat_fraction == 0.0
    with pytest.raises(ConfigError, match="pretrain.repeat_fraction"):
        validate(merge(cfg, {"pretrain": {"repeat_fraction": 1.5}}))
