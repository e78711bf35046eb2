"""Length-bucketed training batches (`train.length_buckets`): the bucket sampler visits every row once
per epoch and groups rows of similar length; a bucketed batch is cut to its longest row, and the loss of
the cut batch (teacher pass with states, drafter, loss) equals the loss of the same rows at full width;
2 gloo processes, each cutting its slice of the global batch, follow one process's loss curve."""

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
from ready.drafter import DSparkDrafter
from ready.train import distributed
from ready.train.anchors import gather_blocks, sample_anchors
from ready.train.batches import BatchError, BatchSampler, batch_indices, batch_width, bucketed_epoch
from ready.train.loss import draft_loss
from ready.train.regen import RegenData
from ready.train.teacher_pass import teacher_pass
from test_train_helpers import micro_cfg, micro_target

torch.set_num_threads(1)


def conversation_like(n: int = 24, width: int = 48, seed: int = 0) -> RegenData:
    """Rows of 10..width tokens, right-padded with 0, trainable on their second half (an assistant turn)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(10, width + 1, (n,), generator=g)
    tokens = torch.randint(2, 128, (n, width), generator=g)
    pos = torch.arange(width).unsqueeze(0)
    tokens = tokens.masked_fill(pos >= lengths.unsqueeze(1), 0)
    mask = (pos >= (lengths // 2).unsqueeze(1)) & (pos < lengths.unsqueeze(1))
    return RegenData(tokens=tokens, prompt_len=1, lengths=lengths, loss_mask=mask)


def _padding(lengths: torch.Tensor, batches: list[torch.Tensor]) -> int:
    return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)


def test_the_bucket_sampler_visits_every_row_once_per_epoch_and_groups_lengths():
    n, bs = 103, 4  # 103 % 4 != 0: epochs begin mid-batch
    lengths = torch.randint(1, 500, (n,), generator=torch.Generator().manual_seed(3))
    sampler = BatchSampler(n, bs, seed=7, lengths=lengths, buckets=8)
    steps = -(-3 * n // bs)  # every position of 3 epochs
    stream = torch.cat([sampler(s) for s in range(steps)])
    for e in range(3):  # each epoch of the stream is a permutation of the rows
        assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n)), e
        assert sorted(bucketed_epoch(lengths, bs, 8, 7, e).tolist()) == list(range(n))
    bucketed = [sampler(s) for s in range(steps)]
    plain = [batch_indices(s, bs, n, 7) for s in range(steps)]
    assert _padding(lengths, bucketed) < 0.25 * _padding(lengths, plain)
    assert all(torch.equal(BatchSampler(n, bs, 7)(s), plain[s]) for s in range(5))  # 0 = today's batches
    again = BatchSampler(n, bs, seed=7, lengths=lengths, buckets=8)
    assert all(torch.equal(again(s), bucketed[s]) for s in (0, 40, steps - 1))  # a function of (seed, step)
    assert not torch.equal(torch.cat([BatchSampler(n, bs, 8, lengths, 8)(s) for s in range(10)]), stream[:40])
    starts = [float(lengths[b].max()) for b in bucketed[:26]]  # long and short batches stay mixed
    assert starts != sorted(starts, reverse=True) and starts != sorted(starts)


def test_bad_bucket_settings_are_one_clear_error():
    with pytest.raises(BatchError, match="length_buckets = -1; expected an integer >= 0"):
        BatchSampler(10, 2, 0, torch.ones(10), buckets=-1)
    with pytest.raises(BatchError, match="one length per row"):
        BatchSampler(10, 2, 0, torch.ones(9), buckets=2)


def test_a_cut_batch_gives_the_full_width_loss(tmp_path):
    """Right padding and causal models: the teacher pass (features, logits, states at anchors - 1), the
    drafter with its reader and the loss on rows cut to their longest row equal the full-width ones."""
    torch.manual_seed(0)
    target, data = micro_target(), conversation_like()
    cfg = micro_cfg(tmp_path)
    drafter = DSparkDrafter(cfg.drafter, cfg.reader, target)
    with torch.no_grad():  # a reader that is not the identity, so the states count
        for p in drafter.reader_parameters():
            p.add_(0.05 * torch.randn_like(p))
    idx = torch.tensor([3, 7, 11, 19])  # lengths 13, 35, 21, 43 of 48
    K = int(drafter.proposals)
    anchors, mask = sample_anchors(data.trainable(idx), K, 5, torch.Generator().manual_seed(1))
    width = batch_width(data, idx, anchors)
    assert width == int(data.lengths[idx].max()) < data.tokens.shape[1]

    def loss(tokens):
        tp = teacher_pass(target, drafter, tokens, anchors, keep=False)
        logits = drafter.forward_train(tokens, tp.hidden, anchors, tp.states)
        terms = draft_loss(logits, gather_blocks(tokens, anchors, K, 1), tp.teacher(anchors, K), mask)
        terms.loss.backward()
        grads = [p.grad.clone() for p in drafter.reader_parameters()]
        drafter.zero_grad(set_to_none=True)
        return terms.loss.detach(), grads

    full, g_full = loss(data.tokens[idx])
    cut, g_cut = loss(data.tokens[idx][:, :width])
    assert mask.any() and torch.allclose(cut, full, rtol=1e-5, atol=1e-6), (cut, full)
    for a, b in zip(g_cut, g_full):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_bucketed_stage_trains_on_batches_as_wide_as_their_longest_row(tmp_path, monkeypatch):
    target, data = micro_target(), conversation_like()
    cfg = micro_cfg(tmp_path, base={"samples": 24, "batch_size": 4, "lr": 3e-3, "anchors_per_sample": 3},
                    length_buckets=2)
    widths = []
    real = stages.teacher_pass

    def spy(target, drafter, tokens, anchors, **kw):
        widths.append(tokens.shape[1])
        return real(target, drafter, tokens, anchors, **kw)

    monkeypatch.setattr(stages, "teacher_pass", spy)
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"enabled": False}), target)
    res = stages.train_stage("base", drafter, target, data, cfg, tmp_path / "base", progress=False)
    sampler = BatchSampler(len(data), 4, stages.stage_seed(0, "base"), data.lengths, 2)
    assert res.steps == 6 and all(torch.isfinite(torch.tensor(res.losses)))
    assert widths == [int(data.lengths[sampler(s)].max()) for s in range(6)]
    assert min(widths) < data.tokens.shape[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bucketed_stage(root: Path):
    torch.manual_seed(5)
    target, data = micro_target(), conversation_like()
    cfg = micro_cfg(root, base={"samples": 16, "batch_size": 4, "lr": 3e-3, "anchors_per_sample": 3},
                    length_buckets=2)
    drafter = DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"enabled": False}), target)
    return stages.train_stage("base", drafter, target, data, cfg, root / "base", progress=False)


def _rank(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    res = _bucketed_stage(Path(root))
    (Path(root) / f"rank{rank}.json").write_text(json.dumps(res.losses))
    distributed.shutdown()


def test_two_gloo_processes_take_slices_of_the_same_bucketed_batches(tmp_path):
    """Each rank cuts its slice to its own longest row; the global loss per step is one process's."""
    one = _bucketed_stage(tmp_path / "one")
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
        assert len(losses) == 4 and torch.allclose(losses, torch.tensor(one.losses), rtol=1e-5, atol=1e-5)
