"""The induction toy's data holds only content-copyable repeats, and the command runs end to end."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.diagnostics.induction_toy import copy_batch, main


def test_every_masked_token_is_predictable_by_copying_what_followed_the_previous_token_before():
    ids, mask = copy_batch(16, 96, 64, torch.Generator().manual_seed(0))
    assert mask.any(dim=1).all()  # one repeat per row
    for row, m in zip(ids, mask):
        for t in m.nonzero().flatten().tolist():
            earlier = [j for j in range(1, t - 1) if row[j - 1] == row[t - 1] and row[j] == row[t]]
            assert earlier, "a masked token must continue a bigram seen earlier"


def test_the_command_trains_and_reports_copy_loss(capsys):
    rows = main(["--layers", "LA", "--steps", "2", "--checks", "2", "--batch", "2", "--device", "cpu"])
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 < r["copy_loss"] < math.log(64) + 2 for r in rows)  # untrained: near chance
    assert capsys.readouterr().out.count('"copy_loss"') == 2


def test_bad_layers_name_the_expected_letters():
    with pytest.raises(SystemExit, match="expected letters L .* and A"):
        main(["--layers", "LXA", "--steps", "1", "--device", "cpu"])
