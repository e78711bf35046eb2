"""Shared artifacts of a sweep (target, data, base drafters), built once before its rows run, so
parallel workers never build the same thing twice."""

from __future__ import annotations

import importlib
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

from ready.allocator import keep_freed_memory
from sweeps.spec import Sweep


def _prepare_one(runner: str, cfg, methods: list[str]) -> tuple[int, float]:
    """`prepare_shared` of one base seed in a pool process: (base seed, seconds)."""
    keep_freed_memory()  # the build's training steps reuse their pages (ready.allocator)
    t0 = time.time()
    importlib.import_module(runner.partition(":")[0]).prepare_shared(cfg, methods, progress=False)
    return int(cfg.train.base_seed), time.time() - t0


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
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        for seed, secs in pool.map(_prepare_one, [runner] * len(configs), list(configs.values()),
                                   [methods] * len(configs)):
            print(f"[sweeps] base drafter of base seed {seed}: ready ({secs:.0f} s)", flush=True)


def release_shared(runner: str) -> None:
    """Free what the runner kept in this process after building the shared artifacts (`sweeps.row` keeps the
    target it loaded, for rows run in this process): with several workers this process runs no row, and
    worker 0 loads its own copy on the same GPU (two 54 GB targets do not fit one card)."""
    release = getattr(importlib.import_module(runner.partition(":")[0]), "release_target", None)
    if release is not None:
        release()
