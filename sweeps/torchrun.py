"""Hand a row's training to torchrun: `train.devices = N > 1` in a plain process (a sweep row).

`run_under_torchrun` is the launcher that `sweeps.row` gives `ready.train.pipeline` (its `launch`): it
writes the config to a file, runs `torchrun --standalone --nproc-per-node N -m
sweeps.commands.train_launch` on it with this interpreter, waits, and leaves the artifacts for the caller
to read. The child side (one rank's training, the command line `ready launch`) is
`sweeps.commands.train_launch`. Both live above the library: the library trains in the process it is
called in and is handed the launcher, so it names no command of its own.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ready.loading import pick_device
from ready.train.distributed import DistributedError


class LaunchError(ValueError):
    """A launch argument the user gave is unusable; the message says what was expected."""


def torchrun_command(nproc: int, args: Sequence[str]) -> list[str]:
    """`torchrun --standalone --nproc-per-node N -m sweeps.commands.train_launch ARGS` with this interpreter
    (a free rendezvous port on this host, so several rows can launch at once)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={int(nproc)}",
            "-m", "sweeps.commands.train_launch", *args]


def run_under_torchrun(cfg: DictConfig, what: str, base_drafter_dir: Optional[str | Path] = None,
                       out_dir: Optional[str | Path] = None, prompts: Optional[torch.Tensor] = None) -> None:
    """Run `what` ("base" or "variant") of `cfg` on `train.devices` processes of this host and wait.

    The children inherit stdout/stderr (progress shows in the caller's log). Interrupting the
    caller stops them; a failed child raises DistributedError."""
    n = int(cfg.train.devices)
    if pick_device(cfg) == "cuda" and n > torch.cuda.device_count():
        raise LaunchError(f"bad value at key 'train.devices': {n} GPUs asked, {torch.cuda.device_count()} visible "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); expected at most "
                          f"{torch.cuda.device_count()}")
    Path(cfg.artifacts_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".launch-", dir=cfg.artifacts_dir) as tmp:
        cfg_file = Path(tmp) / "config.yaml"
        OmegaConf.save(cfg, cfg_file, resolve=True)
        args = ["--config", str(cfg_file), "--what", what]
        if base_drafter_dir is not None:
            args += ["--base-drafter", str(base_drafter_dir)]
        if out_dir is not None:
            args += ["--out-dir", str(out_dir)]
        if prompts is not None:
            torch.save(torch.as_tensor(prompts).long(), Path(tmp) / "prompts.pt")
            args += ["--prompts", str(Path(tmp) / "prompts.pt")]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
        print(f"[ready] training on {n} data-parallel processes: torchrun --nproc-per-node {n} -m sweeps.commands.train_launch",
              file=sys.stderr, flush=True)
        proc = subprocess.Popen(torchrun_command(n, args), env=env)
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C / SIGTERM of the row: torchrun stops its workers
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if code != 0:
        raise DistributedError(f"data-parallel training (train.devices={n}) failed: torchrun exited with code {code}; "
                               "its output is above")
