"""The frozen target's teacher pass: logits only where teachers are read, and one pass per question per process."""

import pytest
import torch
from omegaconf import OmegaConf

from ready.drafter import DSparkDrafter
from ready.memo import MemoError
from ready.target.config import TargetError
from ready.train.anchors import gather_blocks
from ready.train.teacher_pass import MEMO, TeacherMemo, TeacherPass, TeacherPassError, teacher_pass
from test_train_helpers import micro_cfg, micro_prompts, micro_target


@pytest.fixture(scope="module")
def target():
    return micro_target()


@pytest.fixture()
def cfg(tmp_path):
    return micro_cfg(tmp_path)


def _drafter(cfg, target, reader: bool = True, states: str = "own") -> DSparkDrafter:
    torch.manual_seed(0)
    return DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"enabled": reader, "states": states}), target)


TOKENS = micro_prompts(4, 24)
ANCHORS = torch.tensor([[11, 14, 17], [12, 13, 19], [11, 15, 18], [16, 17, 19]])


def test_logits_from_gives_the_full_forwards_rows_and_none_gives_no_logits(target):
    with torch.no_grad():
        full = target(TOKENS).logits
        part = target(TOKENS, logits_from=11)
        none = target(TOKENS, capture_layers=[1], logits_from=None)
    assert torch.equal(part.logits, full[:, 11:])
    assert none.logits is None and none.hidden is not None
    with pytest.raises(TargetError, match="logits_from=24"):
        target(TOKENS, logits_from=24)


def test_the_teacher_is_the_full_logits_gathered_at_the_anchors(cfg, target):
    d = _drafter(cfg, target)
    tp = teacher_pass(target, d, TOKENS, ANCHORS)
    assert tp.start == 11 and tp.logits.shape[1] == 24 - 11
    with torch.no_grad():
        full = target(TOKENS).logits
    assert torch.equal(tp.teacher(ANCHORS, 4), gather_blocks(full, ANCHORS, 4, offset=0))
    with pytest.raises(TeacherPassError, match="without logits"):
        teacher_pass(target, _drafter(cfg, target, reader=False), TOKENS, ANCHORS + 1, logits=False).teacher(ANCHORS, 4)


def test_a_second_row_asking_the_same_gets_the_same_tensors(cfg, target):
    a = teacher_pass(target, _drafter(cfg, target), TOKENS, ANCHORS)
    b = teacher_pass(target, _drafter(cfg, target), TOKENS, ANCHORS)  # another drafter, same question
    assert b is a and MEMO.hits == 1 and MEMO.misses == 1
    other = teacher_pass(target, _drafter(cfg, target), TOKENS, ANCHORS.flip(1).sort(1).values + 1)
    assert other is not a and MEMO.misses == 2


def test_the_no_state_control_is_served_by_a_state_pass_of_the_same_tokens(cfg, target):
    ready = teacher_pass(target, _drafter(cfg, target), TOKENS, ANCHORS)
    ft = teacher_pass(target, _drafter(cfg, target, reader=False), TOKENS, ANCHORS)
    assert MEMO.hits == 1 and ft.states is None
    assert ft.hidden is ready.hidden and ft.logits is ready.logits
    fresh = TeacherMemo(gb=0)
    assert fresh.key(target, TOKENS, ANCHORS, (1,), ()) is None  # a zero budget keeps nothing


def test_the_placebo_pass_is_never_kept(cfg, target):
    placebo = _drafter(cfg, target, states="shuffled")
    teacher_pass(target, placebo, TOKENS, ANCHORS)
    teacher_pass(target, placebo, TOKENS, ANCHORS)
    assert len(MEMO) == 0 and MEMO.hits == 0


def test_changed_weights_never_meet_an_old_pass(cfg, target):
    t = micro_target(seed=3)
    d = _drafter(cfg, t)
    before = teacher_pass(t, d, TOKENS, ANCHORS)
    with torch.no_grad():
        t.lm_head.weight.mul_(2.0)  # an in-place change bumps the version counter
    after = teacher_pass(t, d, TOKENS, ANCHORS)
    assert after is not before and not torch.equal(after.logits, before.logits)


def test_the_memo_drops_the_least_recently_used_pass_past_its_budget():
    def entry(n: int) -> TeacherPass:
        return TeacherPass(hidden=torch.zeros(n), states=None, logits=None)

    memo = TeacherMemo(gb=3 * 400 / (1 << 30))
    for i in range(3):
        memo.put(("w", str(i), "a", (), ("s",)), entry(100))
    assert memo.get(("w", "0", "a", (), ("s",)), logits=False, start=0) is not None  # 0 is now the newest
    memo.put(("w", "3", "a", (), ("s",)), entry(100))
    assert len(memo) == 3 and memo.nbytes == 1200
    assert memo.get(("w", "1", "a", (), ("s",)), logits=False, start=0) is None  # the oldest went
    memo.put(("w", "big", "a", (), ("s",)), entry(1000))  # larger than the whole budget: not kept
    assert len(memo) == 3


def test_a_bad_budget_names_the_key_and_a_new_budget_forgets_what_was_kept():
    with pytest.raises(MemoError, match=r"train.teacher_memo_gb=-1; expected a number of gigabytes >= 0"):
        TeacherMemo(gb=-1)
    memo = TeacherMemo(gb=1e-6)
    memo.put(("w", "0", "a", (), ("s",)), TeacherPass(hidden=torch.zeros(10), states=None, logits=None))
    assert len(memo) == 1
    memo.configure(0)
    assert memo.budget == 0 and len(memo) == 0


def test_only_the_adaptation_stages_keep_their_passes(tmp_path, cfg, target):
    from ready.train import greedy_responses, train_stage

    data = greedy_responses(target, micro_prompts(8, 12), 12, eos_id=None, batch_size=8, progress=False)
    train_stage("base", _drafter(cfg, target), target, data, cfg, tmp_path / "base", progress=False)
    assert len(MEMO) == 0  # one base drafter per seed: no later row asks its questions
    d = _drafter(cfg, target)
    train_stage("stage1", d, target, data, cfg, tmp_path / "s1", progress=False)
    kept = len(MEMO)
    assert kept > 0
    train_stage("stage1", _drafter(cfg, target), target, data, cfg, tmp_path / "s1b", progress=False)
    assert len(MEMO) == kept and MEMO.hits >= kept  # the second row of the seed asks nothing anew
