"""Shared artifacts of a sweep (target, data, base drafters), built once before its rows run, so
parallel workers never build the same thing twice."""

from __future__ import annotations

import importlib
import multiprocessing
import queue
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Optional

from tqdm.auto import tqdm

from ready.allocator import keep_freed_memory
from ready.train.stages import num_steps
from sweeps.spec import Sweep

_steps: Optional[Any] = None  # in a pool process: the queue its builds report (base seed, step) to


def _pool_init(steps: Any) -> None:
    global _steps
    _steps = steps


def _report_step(seed: int) -> Any:
    """A training callback that sends (seed, step) to the parent's bar, once per optimizer step."""
    last = [0]

    def callback(name: str, value: float, step: int) -> None:  # noqa: ARG001
        if step != last[0] and _steps is not None:
            last[0] = step
            _steps.put((seed, step))
    return callback


def _prepare_one(runner: str, cfg, methods: list[str]) -> tuple[int, float]:
    """`prepare_shared` of one base seed in a pool process: (base seed, seconds). Its training steps go
    to the parent's progress bar (`_pool_init`)."""
    keep_freed_memory()  # the build's training steps reuse their pages (ready.allocator)
    t0 = time.time()
    seed = int(cfg.train.base_seed)
    importlib.import_module(runner.partition(":")[0]).prepare_shared(cfg, methods, progress=False,
                                                                     callback=_report_step(seed))
    return seed, time.time() - t0


def builds_at_once(builds: int, workers: int) -> int:
    """How many base drafters build side by side: all of them when they are at most twice the
    workers (3 seeds on 2 cores: three time-sliced processes keep both cores busy, where 2 + 1
    left one idle for a whole build, ~3.5 min of the embedded default), else one per worker."""
    return builds if builds <= 2 * workers else workers


def prepare_artifacts(runner: str, sweep: Sweep, progress: bool, workers: int = 1, gpus: bool = False) -> None:
    """Build the shared artifacts before the rows run. Each base seed's drafter is its own build: with
    several workers on CPU they are built side by side, one process each (`builds_at_once`), after the
    artifacts every seed shares (the runner's `prepare_common`, when it has one). Each build runs on the
    torch CPU threads its config names (`threads.shared`, `threads.drafters`; `ready.threads`), so
    neither the worker count nor the machine's load changes what it builds."""
    module = importlib.import_module(runner.partition(":")[0])
    prepare = getattr(module, "prepare_shared", None)
    if prepare is None:
        return
    methods = sorted({v.method for v in sweep.rows} | ({"ready"} if sweep.spec.search else set()))
    configs = {int(sweep.common.train.base_seed): sweep.common}
    for job in sweep.jobs():  # one base drafter per seed when seeds replicate it
        configs.setdefault(int(job.cfg.train.base_seed), job.cfg)
    common = getattr(module, "prepare_common", None)
    side_by_side = workers > 1 and len(configs) > 1 and common is not None and not gpus
    if not side_by_side:
        for cfg in configs.values():
            prepare(cfg, methods, progress=progress)
        return
    common(sweep.common, methods, progress=progress)
    n = builds_at_once(len(configs), workers)
    print(f"[sweeps] building {len(configs)} base drafters, {n} at a time", flush=True)
    per_seed = {seed: num_steps(cfg.train.base.samples, cfg.train.base.batch_size) for seed, cfg in configs.items()}
    done = dict.fromkeys(per_seed, 0)
    ctx = multiprocessing.get_context("spawn")
    steps = ctx.Queue()
    bar = tqdm(total=sum(per_seed.values()), desc=f"base drafters ({len(configs)}, {n} at a time)", unit="step",
               disable=not progress)

    def drain(timeout: float) -> None:
        try:
            while True:
                seed, step = steps.get(timeout=timeout)
                bar.update(max(0, min(step, per_seed[seed]) - done[seed]))
                done[seed] = max(done[seed], min(step, per_seed[seed]))
                timeout = 0.0
        except queue.Empty:
            pass

    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_pool_init, initargs=(steps,)) as pool:
        pending = {pool.submit(_prepare_one, runner, cfg, methods) for cfg in configs.values()}
        while pending:
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            drain(0.05)
            for future in finished:
                seed, secs = future.result()
                bar.update(per_seed[seed] - done[seed])  # a cached drafter trains no step: its share is done
                done[seed] = per_seed[seed]
                bar.write(f"[sweeps] base drafter of base seed {seed}: ready ({secs:.0f} s)")
    bar.close()


def release_shared(runner: str) -> None:
    """Free what the runner kept in this process after building the shared artifacts (`sweeps.row` keeps the
    target it loaded, for rows run in this process): with several workers this process runs no row, and
    worker 0 loads its own copy on the same GPU (two 54 GB targets do not fit one card)."""
    release = getattr(importlib.import_module(runner.partition(":")[0]), "release_target", None)
    if release is not None:
        release()
