"""The confidence-label diagnostic reads the head, its labels and the greedy acceptance teacher-forced, and its
refit recovers a head that predicts what it is fit to."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks.diagnostics.confidence_label import collect, diagnose, head_calibration, refit
from ready.drafter import DSparkDrafter
from ready.train import greedy_responses
from test_train_helpers import micro_cfg, micro_prompts, micro_target


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = micro_target()
    cfg = micro_cfg(tmp_path_factory.mktemp("cfg"))
    torch.manual_seed(0)
    drafter = DSparkDrafter(OmegaConf.merge(cfg.drafter, {"confidence_head": True}),
                            OmegaConf.merge(cfg.reader, {"enabled": False}), target).eval()
    data = greedy_responses(target, micro_prompts(6, 12), 10, eos_id=None, batch_size=6, progress=False)
    return target, drafter, data


def test_it_reads_the_heads_confidences_and_the_greedy_acceptance_of_every_full_block(setup):
    target, drafter, data = setup
    got = collect(drafter, target, data)
    K = int(drafter.proposals)
    n = 6 * (10 - K + 1)  # one block per anchor with K target tokens after it
    assert got["conf"].shape == got["hit"].shape == got["label_0"].shape == (n, K)
    assert got["x"].shape[:2] == (n, K)
    # the features are the head's input: its linear layer on them gives its confidences back
    with torch.no_grad():
        again = drafter.confidence_head.proj(got["x"]).squeeze(-1).sigmoid()
    assert torch.allclose(again, got["conf"], atol=1e-5)
    # on target-regenerated sequences the greedy label is the acceptance itself
    assert torch.equal(got["label_0"], got["hit"])
    assert bool(((got["label_1"] >= 0) & (got["label_1"] <= 1)).all())


def test_calibration_compares_the_predicted_prefix_to_the_accepted_one():
    conf = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    hit = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    cal = head_calibration(conf, hit)
    assert [p["observed"] for p in cal["positions"]] == [1.0, 0.5]
    assert [p["ece"] for p in cal["positions"]] == [0.0, 0.5]


def test_a_refit_head_predicts_the_rate_it_was_fit_to():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 3, 5, generator=g)
    w = torch.tensor([1.5, -1.0, 0.5, 0.0, 2.0])
    p = torch.sigmoid(x @ w + 0.3)
    label = (torch.rand(p.shape, generator=g) < p).float()
    lin = refit(x, label, {"weight": torch.zeros(1, 5), "bias": torch.zeros(1)})
    with torch.no_grad():
        got = lin(x).squeeze(-1).sigmoid()
    assert (got - p).abs().mean() < 0.03


def test_the_diagnosis_reports_every_position_for_the_head_and_both_refits(setup):
    target, drafter, data = setup
    out = diagnose(drafter, target, data, data, train_sequences=4)
    K = int(drafter.proposals)
    assert [p["j"] for p in out["given_prefix"]] == list(range(1, K + 1))
    assert out["given_prefix"][0]["blocks"] == out["heldout_blocks"]  # every block reaches its first draft
    for key in ("head", "refit_label_1", "refit_label_0"):
        assert len(out[key]["positions"]) == K and 0.0 <= out[key]["ece"] <= 1.0
