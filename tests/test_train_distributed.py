"""Data-parallel training (issue 21) on a micro target: 2 gloo processes under torchrun against 1
process at the same global batch (regenerated data, loss per step of every stage, final weights),
and a 2-process run killed mid-stage that resumes in one process. The same comparison over NCCL
needs 2 GPUs (`-m cuda`)."""

import os
import signal
import socket

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from pathlib import Path

from ready.drafter import DSparkDrafter, load_drafter
from ready.target import save_target
from ready.train import distributed, greedy_responses
from ready.train.pipeline import PipelineError, ensure_base_drafter, train_variant
from ready.train.stages import CHECKPOINT, TrainStageError, train_stage
from sweeps.commands.train_launch import stage_logs
from sweeps.torchrun import run_under_torchrun
from test_train_helpers import micro_cfg, micro_prompts, micro_target

# 16 sequences, global batch 4: base 4 steps, stage 1 and stage 2 2 steps each
STAGE = {"batch_size": 4, "lr": 3e-3, "anchors_per_sample": 3, "warmup": 0.1}
BUDGET = dict(base=dict(STAGE, samples=16), stage1=dict(STAGE, samples=8), stage2=dict(STAGE, samples=8),
              checkpoint_every=1)
PROMPTS = micro_prompts(16, 12)


def _setup(root: Path, device: str, devices: int):
    """A micro target saved where the torchrun processes load it from, and a config naming it."""
    target = micro_target().to(device)
    save_target(target, root / "target")
    cfg = micro_cfg(root, **BUDGET)
    cfg = OmegaConf.merge(cfg, {"target": {"source": str(root / "target"), "pretrain": False, "device": device},
                                "train": {"devices": devices}})
    return target, cfg


def _weights(module_or_dir, target=None) -> dict[str, torch.Tensor]:
    module = load_drafter(module_or_dir, target) if isinstance(module_or_dir, (str, Path)) else module_or_dir
    return {n: p.detach().float().cpu() for n, p in module.named_parameters()}


def _regen(root: Path) -> torch.Tensor:
    (folder,) = (root / "artifacts" / "regen").iterdir()
    return torch.load(folder / "data.pt", weights_only=True)["tokens"]


def _logs(root: Path, final: Path) -> dict[str, dict]:
    (base,) = (root / "artifacts" / "drafter_base").glob("*/drafter")
    return {**stage_logs(base), **stage_logs(Path(final))}


def _compare(tmp_path: Path, device: str, loss_tol: float, weight_tol: float) -> None:
    one_target, one = _setup(tmp_path / "one", device, 1)
    two_target, two = _setup(tmp_path / "two", device, 2)
    final_two = train_variant(two, two_target, None, None, tmp_path / "two" / "stages", progress=False, prompts=PROMPTS,
                              launch=run_under_torchrun)
    final_one = train_variant(one, one_target, None, None, tmp_path / "one" / "stages", progress=False, prompts=PROMPTS)

    assert torch.equal(_regen(tmp_path / "one"), _regen(tmp_path / "two"))  # sharded regeneration = one process's
    logs_one, logs_two = _logs(tmp_path / "one", final_one), _logs(tmp_path / "two", final_two)
    assert set(logs_one) == set(logs_two) == {"base", "stage1", "stage2"}
    for stage in logs_one:
        assert logs_two[stage]["world_size"] == 2 and logs_one[stage]["world_size"] == 1, stage
        a, b = torch.tensor(logs_one[stage]["losses"]), torch.tensor(logs_two[stage]["losses"])
        assert len(a) == len(b) == {"base": 4, "stage1": 2, "stage2": 2}[stage]
        assert torch.allclose(a, b, rtol=loss_tol, atol=loss_tol), (stage, a, b)
    for kind in ("regen", "drafter_base"):  # cache keys do not depend on N (a stage's names its start's weights)
        assert [f.name for f in (tmp_path / "one" / "artifacts" / kind).iterdir()] == \
               [f.name for f in (tmp_path / "two" / "artifacts" / kind).iterdir()]
    w1, w2 = _weights(final_one, one_target), _weights(final_two, one_target)
    assert w1.keys() == w2.keys()
    for n in w1:
        assert torch.allclose(w1[n], w2[n], rtol=weight_tol, atol=weight_tol), (n, (w1[n] - w2[n]).abs().max())


def test_two_gloo_processes_under_torchrun_follow_one_process(tmp_path):
    """train.devices=2 hands the row's training to torchrun (2 gloo processes: the launcher a sweep row gives the
    pipeline, sweeps.torchrun.run_under_torchrun); the regenerated data,
    every stage's loss curve and the final drafter equal one process's at the same global batch."""
    _compare(tmp_path, "cpu", loss_tol=1e-5, weight_tol=1e-4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_drafter(cfg, target) -> DSparkDrafter:
    torch.manual_seed(5)
    return DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"enabled": False}), target)


def _killed_rank(rank: int, world: int, port: int, root: str) -> None:
    """One of 2 gloo ranks training the base stage; rank 0 SIGKILLs itself after step 2's checkpoint."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    target, cfg = micro_target(), micro_cfg(Path(root), **BUDGET)
    data = greedy_responses(target, PROMPTS, 12, progress=False)

    def kill(name, value, step):
        if step == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    train_stage("base", _base_drafter(cfg, target), target, data, cfg, Path(root) / "cut", callback=kill, progress=False)


def test_a_killed_two_process_stage_resumes_in_one_process(tmp_path):
    """A kill mid-stage leaves rank 0's last checkpoint; one process resumes from it (another N) and
    ends where an uninterrupted one-process run ends."""
    # fork: the ranks start with this process's imports (spawn would spend most of the test importing)
    ctx = mp.start_processes(_killed_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=False,
                             start_method="fork")
    with pytest.raises(mp.ProcessExitedException):
        assert not ctx.join(timeout=120), "the ranks finished a stage that rank 0 was to kill"
        for p in ctx.processes:  # still running after 2 minutes: hung
            p.kill()
        pytest.fail("the 2 ranks did not end within 120 s")
    assert ctx.processes[0].exitcode == -signal.SIGKILL
    assert int(torch.load(tmp_path / "cut" / CHECKPOINT, weights_only=True)["step"]) == 2

    target, cfg = micro_target(), micro_cfg(tmp_path, **BUDGET)
    data = greedy_responses(target, PROMPTS, 12, progress=False)
    resumed, whole = _base_drafter(cfg, target), _base_drafter(cfg, target)
    res = train_stage("base", resumed, target, data, cfg, tmp_path / "cut", progress=False)
    ref = train_stage("base", whole, target, data, cfg, tmp_path / "whole", progress=False)
    assert res.resumed_from == 2 and ref.resumed_from == 0 and len(res.losses) == len(ref.losses) == 4
    assert torch.allclose(torch.tensor(res.losses), torch.tensor(ref.losses), rtol=1e-5, atol=1e-5)
    w_cut, w_whole = _weights(resumed), _weights(whole)
    for n in w_whole:
        assert torch.allclose(w_cut[n], w_whole[n], rtol=1e-4, atol=1e-4), n


def test_a_stage_torchrun_did_not_build_is_an_error_not_a_second_training(tmp_path):
    """After the hand-over to torchrun the stage must be built (e.g. the row's in-memory target is
    the one the config names); otherwise one clear error, never a silent one-process training."""
    calls = []
    target, cfg = _setup(tmp_path, "cpu", 2)
    with pytest.raises(PipelineError, match="did not build this stage"):
        ensure_base_drafter(cfg, target, None, progress=False, prompts=PROMPTS, launch=lambda *a, **k: calls.append(a[1]))
    assert calls == ["base"]


def test_several_devices_without_a_launcher_is_one_clear_error(tmp_path):
    """The library starts no processes itself: train.devices=2 outside torchrun, with nothing built and no
    launcher given, is one error naming the key, never a silent one-process training."""
    target, cfg = _setup(tmp_path, "cpu", 2)
    with pytest.raises(PipelineError, match=r"bad value at key 'train.devices': 2 data-parallel processes"):
        ensure_base_drafter(cfg, target, None, progress=False, prompts=PROMPTS)
    with pytest.raises(PipelineError, match=r"key 'train.devices'"):
        train_variant(cfg, target, None, None, tmp_path / "stages", progress=False, prompts=PROMPTS)
    assert not (tmp_path / "artifacts" / "drafter_base").exists()


def test_a_batch_smaller_than_the_process_count_is_refused(tmp_path, monkeypatch):
    target, cfg = _setup(tmp_path, "cpu", 1)
    data = greedy_responses(target, PROMPTS, 12, progress=False)
    monkeypatch.setattr(distributed, "world", lambda: distributed.World(rank=0, size=8))
    with pytest.raises(TrainStageError, match=r"train.stage1.batch_size=4 .* 8 data-parallel"):
        train_stage("stage1", DSparkDrafter(cfg.drafter, cfg.reader, target), target, data, cfg, tmp_path / "s",
                    progress=False)


def test_each_worker_gets_train_devices_gpus():
    from sweeps.run import gpu_groups

    assert gpu_groups(list("01234567"), 4, 2) == ["0,1", "2,3", "4,5", "6,7"]
    assert gpu_groups(list("0123"), 4, 1) == ["0", "1", "2", "3"]
    assert gpu_groups(list("012"), 3, 2) == ["0,1", "0,1", "0,1"]  # too few GPUs: groups shared round-robin


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_nccl_gpus_follow_one_gpu(tmp_path):
    """The NCCL path: 2 GPUs against 1. Training runs under bf16 autocast on CUDA, so the tolerances
    are looser (not yet calibrated on hardware: docs/sweeps.md "Measuring data-parallel training")."""
    _compare(tmp_path, "cuda", loss_tol=2e-2, weight_tol=5e-2)
