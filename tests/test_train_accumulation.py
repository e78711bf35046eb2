"""Gradient accumulation (`train.micro_batch_size`): a batch run in micro-batches takes the same optimizer
step as the batch in one pass (same loss and logged metrics, same gradient before clipping, same updated
weights, float32, up to rounding) for the reader stage and for base, with length buckets and with a
teacher store too; 2 gloo processes accumulating micro-batches under `no_sync` follow one process; the
state placebo refuses micro-batches of one sequence; `checkpoints=False` writes no checkpoint."""

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

import ready.train.stages as stages
from ready.config import ConfigError, merge, validate
from ready.drafter import DSparkDrafter
from ready.train import distributed, greedy_responses
from ready.train.stages import CHECKPOINT, TrainStageError, micro_batches, train_stage
from ready.train.teacher_store import TeacherStore, store_capture
from test_train_batches import conversation_like
from test_train_helpers import micro_cfg, micro_prompts, micro_target

torch.set_num_threads(1)

ONE_STEP = {"samples": 8, "batch_size": 8, "lr": 3e-3, "anchors_per_sample": 3, "warmup": 0.0}
METRICS = ("loss", "ce", "l1", "accuracy", "tau_hat", "grad_norm")


@pytest.fixture(scope="module")
def target():
    return micro_target()


@pytest.fixture(scope="module")
def data(target):
    return greedy_responses(target, micro_prompts(16, 12), 12, eos_id=None, batch_size=8, progress=False)


def _drafter(cfg, target, stage: str, seed: int = 0, **reader) -> DSparkDrafter:
    """The stage's drafter; with a reader that is not the identity (so its states and every reader
    parameter get a gradient)."""
    torch.manual_seed(seed)
    rcfg = OmegaConf.merge(cfg.reader, {"enabled": stage != "base", **reader})
    drafter = DSparkDrafter(cfg.drafter, rcfg, target)
    with torch.no_grad():
        for p in drafter.reader_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return drafter


def _one_step(tmp_path: Path, target, data, stage: str, micro: int, monkeypatch, store=None, **train) -> dict:
    """One optimizer step of `stage` at micro_batch_size `micro`: the logged metrics, the gradients
    clipping saw, the updated weights, and the widths of the teacher passes."""
    cfg = micro_cfg(tmp_path, **{stage: ONE_STEP}, micro_batch_size=micro, **train)
    drafter = _drafter(cfg, target, stage)
    grads: list[torch.Tensor] = []
    widths: list[int] = []
    real_clip, real_pass = torch.nn.utils.clip_grad_norm_, stages.teacher_pass

    def clip(params, max_norm):
        params = list(params)
        grads.extend(p.grad.detach().clone() for p in params)
        return real_clip(params, max_norm)

    def spy(target, drafter, tokens, anchors, **kw):
        widths.append(tokens.shape[1])
        return real_pass(target, drafter, tokens, anchors, **kw)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(stages, "teacher_pass", spy)
    metrics: dict[str, float] = {}
    res = train_stage(stage, drafter, target, data, cfg, tmp_path / f"{stage}-{micro}", progress=False, store=store,
                      callback=lambda k, v, s: metrics.__setitem__(k.rsplit("/", 1)[1], v))
    monkeypatch.undo()
    assert res.steps == 1 and metrics["loss"] == res.losses[0]
    weights = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    return {"metrics": metrics, "grads": grads, "weights": weights, "widths": widths}


def _same_step(a: dict, b: dict) -> None:
    for k in METRICS:
        assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-5, abs=1e-6), k
    assert len(a["grads"]) == len(b["grads"]) > 0
    for g, h in zip(a["grads"], b["grads"]):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)
    assert a["weights"].keys() == b["weights"].keys()
    # AdamW's first step is about lr * g / |g|: for a gradient entry near 0 the rounding above moves it by
    # up to ~2e-6 here; 1e-5 is 0.3 % of the step (lr 3e-3)
    for n in a["weights"]:
        torch.testing.assert_close(a["weights"][n], b["weights"][n], rtol=1e-5, atol=1e-5, msg=n)


def test_micro_batches_cut_a_share_into_slices_of_at_most_m_rows():
    assert micro_batches(8, 0) == [slice(0, 8)] and micro_batches(8, 8) == micro_batches(8, 20) == [slice(0, 8)]
    assert micro_batches(8, 2) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches(5, 2, pairs=True) == [slice(0, 2), slice(2, 5)]  # the placebo needs a second row
    assert micro_batches(3, 2, pairs=True) == [slice(0, 3)]


@pytest.mark.parametrize("stage", ["stage1", "base"])
def test_micro_batches_of_2_take_the_one_pass_step(tmp_path, target, data, stage, monkeypatch):
    one = _one_step(tmp_path / "one", target, data, stage, 0, monkeypatch)
    acc = _one_step(tmp_path / "acc", target, data, stage, 2, monkeypatch)
    assert len(one["widths"]) == 1 and len(acc["widths"]) == 4  # 8 rows: one pass vs 4 micro-batches
    _same_step(one, acc)
    start = _drafter(micro_cfg(tmp_path), target, stage).state_dict()
    assert any(not torch.equal(start[n], w) for n, w in acc["weights"].items())  # the step moved the weights


def test_micro_batches_with_length_buckets_are_cut_to_their_own_longest_row(tmp_path, target, monkeypatch):
    rows = conversation_like()
    one = _one_step(tmp_path / "one", target, rows, "stage1", 0, monkeypatch, length_buckets=2)
    acc = _one_step(tmp_path / "acc", target, rows, "stage1", 3, monkeypatch, length_buckets=2)
    assert len(acc["widths"]) == 3 and max(acc["widths"]) == one["widths"][0] > min(acc["widths"])
    _same_step(one, acc)


def test_micro_batches_read_the_teacher_store_rows(tmp_path, target, data, monkeypatch):
    cfg = micro_cfg(tmp_path, base=ONE_STEP)
    store = TeacherStore.build(target, data, store_capture(cfg, target), batch=8, progress=False)
    if not store.exact(target):
        pytest.skip("the micro target's passes depend on the batch slot at this thread count: no store serves")
    served = []
    real = TeacherStore.teacher_pass
    monkeypatch.setattr(TeacherStore, "teacher_pass", lambda self, *a: served.append(1) or real(self, *a))
    one = _one_step(tmp_path / "one", target, data, "base", 0, monkeypatch, store=store)
    monkeypatch.setattr(TeacherStore, "teacher_pass", lambda self, *a: served.append(1) or real(self, *a))
    acc = _one_step(tmp_path / "acc", target, data, "base", 2, monkeypatch, store=store)
    assert len(served) == 1 + 4 and one["widths"] == acc["widths"] == []  # no teacher pass ran afresh
    _same_step(one, acc)


def test_the_state_placebo_refuses_micro_batches_of_one_sequence(tmp_path, target, data):
    cfg = micro_cfg(tmp_path, stage1=ONE_STEP, micro_batch_size=1)
    placebo = _drafter(cfg, target, "stage1", states="shuffled")
    with pytest.raises(TrainStageError, match=r"train.micro_batch_size=1 with reader.states=shuffled"):
        train_stage("stage1", placebo, target, data, cfg, tmp_path / "p", progress=False)
    with pytest.raises(ConfigError, match=r"key 'train.micro_batch_size': 1; expected 0 or >= 2"):
        validate(merge(cfg, {"reader": {"states": "shuffled"}}))
    validate(cfg)  # micro-batches of one are fine for a reader that reads its own states
    with pytest.raises(ConfigError, match=r"key 'train.micro_batch_size': -1; expected an integer >= 0"):
        validate(merge(cfg, {"train": {"micro_batch_size": -1}}))
    # micro-batches of 2 with an odd share: the lone last row joins the one before it
    cfg2 = micro_cfg(tmp_path, stage1=dict(ONE_STEP, batch_size=5, samples=5), micro_batch_size=2)
    res = train_stage("stage1", _drafter(cfg2, target, "stage1", states="shuffled"), target, data, cfg2,
                      tmp_path / "p2", progress=False)
    assert res.steps == 1 and torch.isfinite(torch.tensor(res.losses)).all()


def test_checkpoints_false_writes_no_checkpoint(tmp_path, target, data):
    cfg = micro_cfg(tmp_path, stage1=dict(ONE_STEP, samples=16), checkpoint_every=1)
    train_stage("stage1", _drafter(cfg, target, "stage1"), target, data, cfg, tmp_path / "on", progress=False)
    assert (tmp_path / "on" / CHECKPOINT).is_file()
    res = train_stage("stage1", _drafter(cfg, target, "stage1"), target, data, cfg, tmp_path / "off", progress=False,
                      checkpoints=False)
    assert res.steps == 2 and not (tmp_path / "off").exists()


# --- data-parallel: 2 gloo processes, each accumulating micro-batches of its slice ----------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_stage(root: Path, micro: int):
    """Stage 1, 2 steps of 5 sequences: rank 0 takes 3 rows (micro-batches of 2 + 1 at micro 2), rank 1
    takes 2 (one micro-batch): the ranks run different numbers of passes between the same collectives."""
    target = micro_target()
    data = greedy_responses(target, micro_prompts(16, 12), 12, eos_id=None, batch_size=8, progress=False)
    cfg = micro_cfg(root, stage1=dict(ONE_STEP, samples=10, batch_size=5), micro_batch_size=micro)
    drafter = _drafter(cfg, target, "stage1")
    res = train_stage("stage1", drafter, target, data, cfg, root / "s1", progress=False)
    return res, {n: p.detach().clone() for n, p in drafter.named_parameters()}


def _rank(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    res, weights = _ddp_stage(Path(root), 2)
    (Path(root) / f"rank{rank}.json").write_text(json.dumps(res.losses))
    torch.save(weights, Path(root) / f"rank{rank}.pt")
    distributed.shutdown()


def test_two_gloo_processes_accumulating_micro_batches_follow_one_process(tmp_path):
    one, w_one = _ddp_stage(tmp_path / "one", 0)
    (tmp_path / "two").mkdir()
    ctx = mp.start_processes(_rank, args=(2, _free_port(), str(tmp_path / "two")), nprocs=2, join=False,
                             start_method="fork")
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 2 ranks did not end within 120 s")
    for rank in (0, 1):
        losses = torch.tensor(json.loads((tmp_path / "two" / f"rank{rank}.json").read_text()))
        assert len(losses) == 2 and torch.allclose(losses, torch.tensor(one.losses), rtol=1e-5, atol=1e-6)
        weights = torch.load(tmp_path / "two" / f"rank{rank}.pt", weights_only=True)
        for n, w in w_one.items():
            torch.testing.assert_close(weights[n], w, rtol=1e-4, atol=1e-6, msg=n)
