"""The teacher-forced acceptance equals the engine's greedy acceptance from the same anchors."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from ready.decode.rounds import greedy_accept
from ready.decode.protocol import DraftStep
from ready.drafter import DSparkDrafter
from ready.train import greedy_responses, train_stage
from ready.train.teacher_forced import block_acceptance, compact_anchors, full_block_anchors, teacher_forced_acceptance
from test_train_helpers import micro_cfg, micro_prompts, micro_target




@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A micro target, its greedy data, and a ReaDy drafter trained enough to accept some drafts."""
    target = micro_target()
    cfg = micro_cfg(tmp_path_factory.mktemp("tf"), base={"samples": 160, "batch_size": 8, "lr": 1e-2,
                                                          "anchors_per_sample": 8, "warmup": 0.1})
    data = greedy_responses(target, micro_prompts(24, 12), 12, eos_id=None, batch_size=8, progress=False)
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg.drafter, cfg.reader, target)
    train_stage("base", drafter, target, data, cfg, tmp_path_factory.mktemp("work"), progress=False)
    return target, drafter.eval(), data


def engine_acceptance(target, drafter, tokens: torch.Tensor, a: int) -> int:
    """What one engine round accepts after committing tokens[:a+1]: drafts vs the target's argmaxes."""
    cache = target.new_cache(1, max_len=tokens.numel() + 8, max_verify=drafter.proposals + 1)
    out = target.prefill(tokens[None, :a], cache, capture_layers=drafter.capture_layers)
    step = DraftStep(tokens=tokens[None, : a + 1], features=out.hidden, target=target, cache=cache)
    drafts = drafter.propose(step)
    ver = target.verify(torch.cat([tokens[None, a:a + 1], drafts], 1), cache)
    return greedy_accept(drafts[0], ver.logits[0].argmax(-1))


def test_every_anchors_acceptance_equals_an_engine_round_from_it(setup):
    target, drafter, data = setup
    anchors, valid = full_block_anchors(data, drafter.proposals)
    rows = torch.arange(4)
    acc = block_acceptance(drafter, target, data.tokens[rows], anchors[rows])
    seen = []
    for b in rows.tolist():
        for i in valid[b].nonzero().flatten().tolist():
            a = int(anchors[b, i])
            assert int(acc[b, i]) == engine_acceptance(target, drafter, data.tokens[b], a), (b, a)
            seen.append(int(acc[b, i]))
    assert max(seen) >= 1 and min(seen) < drafter.proposals  # accepted and rejected drafts both checked


def test_tallies_pool_every_full_block_and_the_placebo_reads_another_row(setup):
    target, drafter, data = setup
    K = drafter.proposals
    res = teacher_forced_acceptance(drafter, target, data, batch_size=5, progress=False)
    per_seq = data.tokens.shape[1] - K - (data.prompt_len - 1)  # anchors prompt_len-1 .. T-K-1
    assert res["sequences"]["blocks"] == [per_seq] * len(data)
    assert res["tau"] == pytest.approx(sum(res["sequences"]["committed"]) / (per_seq * len(data)))
    assert 1.0 <= res["tau"] <= K + 1

    placebo = DSparkDrafter(drafter.drafter_cfg, OmegaConf.merge(OmegaConf.create(drafter.reader_cfg),
                                                                 {"states": "shuffled"}), target)
    for r in drafter.readers.values():  # a reader that matters, so other states change the drafts
        torch.nn.init.normal_(r.fuse_out.weight, std=1.0)
    placebo.load_state_dict(drafter.state_dict())  # the same weights: only the states read differ
    own = teacher_forced_acceptance(drafter, target, data, batch_size=5, progress=False)
    other = teacher_forced_acceptance(placebo.eval(), target, data, batch_size=5, progress=False)
    assert own["sequences"]["blocks"] == other["sequences"]["blocks"]
    assert own["sequences"]["committed"] != other["sequences"]["committed"]


def test_compacted_anchors_keep_each_rows_valid_anchors_in_order():
    anchors = torch.arange(3, 9).expand(3, 6)
    valid = torch.tensor([[0, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    a, ok = compact_anchors(anchors, valid)
    assert ok.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert a[0, :2].tolist() == [4, 6] and a[2].tolist() == [3, 4, 5]
    assert a[1].tolist() == [3, 3, 3]  # a row without valid anchors keeps an in-range placeholder


def test_a_block_accepts_the_same_whichever_other_anchors_share_its_batch(setup):
    """Dropping other anchors (what the compaction does) leaves every kept block's acceptance as it was."""
    target, drafter, data = setup
    anchors, valid = full_block_anchors(data, drafter.proposals)
    rows = torch.arange(4)
    full = block_acceptance(drafter, target, data.tokens[rows], anchors[rows])
    keep = valid[rows] & (torch.rand(valid[rows].shape, generator=torch.Generator().manual_seed(0)) < 0.4)
    a, ok = compact_anchors(anchors[rows], keep)
    assert a.shape[1] < anchors.shape[1]
    part = block_acceptance(drafter, target, data.tokens[rows], a)
    for b in range(len(rows)):
        assert part[b][ok[b]].tolist() == full[b][keep[b]].tolist()
