"""A cheap stand-in for `sweeps.row` that the sweep tests inject with `--runner`.

It returns real `ready.metrics.Metrics` computed from made-up acceptance logs (numbers depend on
the config so rows differ), with the per-prompt records of an evaluation.json so the paired
intervals are computed as for real runs, and appends one line per call to $FAKE_RUN_LOG so tests can count
who ran what. Knobs (environment, so worker processes see them too):
FAKE_RUN_SLEEP seconds per call; FAKE_RUN_BARRIER=N makes the first call of every process wait
until N processes have started a call (forces real overlap); FAKE_PREPARE_BARRIER=N makes every base
drafter build wait until N processes have started one, then log its end (builds that overlap pass it,
builds one after another never would); FAKE_RUN_FAIL=<label> fails rows whose name contains it. This
file holds no tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ready.metrics import SequenceLog, overall, summarize
from sweeps.row import VariantResult

_started = False


def _log(event: str, cfg, method: str) -> None:
    from sweeps.spec import job_hash

    path = os.environ.get("FAKE_RUN_LOG")
    if path:
        line = json.dumps({"event": event, "pid": os.getpid(), "name": str(cfg.name), "method": method,
                           "hash": job_hash(cfg, method) if method != "prepare" else "", "t": time.time(),
                           "base_seed": int(cfg.train.base_seed)})
        with open(path, "a") as f:
            f.write(line + "\n")


def _wait_for_peers() -> None:
    global _started
    n = int(os.environ.get("FAKE_RUN_BARRIER", "0"))
    if _started or n <= 1:
        return
    _started = True
    _wait_for(n)


def _wait_for(n: int, event: str = "") -> None:
    """Until `n` processes have logged a call (`event` only, when given); the 60 s deadline only ends a
    wait that can never be met."""
    deadline = time.time() + 60
    while time.time() < deadline:
        lines = [json.loads(x) for x in Path(os.environ["FAKE_RUN_LOG"]).read_text().splitlines()]
        if len({x["pid"] for x in lines if not event or x["event"] == event}) >= n:
            return
        time.sleep(0.05)


def prepare_common(cfg, methods, progress: bool = True) -> None:
    _log("prepare_common", cfg, "prepare")


def prepare_shared(cfg, methods, progress: bool = True, callback=None) -> None:
    _log("prepare", cfg, "prepare")
    if callback is not None:  # as the base drafter's training reports each step
        callback("train/base/loss", 1.0, 1)
    n = int(os.environ.get("FAKE_PREPARE_BARRIER", "0"))
    if n > 1:
        _wait_for(n, "prepare")
    _log("prepare_end", cfg, "prepare")


def run_variant(cfg, method: str = "ready", progress: bool = True) -> VariantResult:
    _log("start", cfg, method)
    _wait_for_peers()
    time.sleep(float(os.environ.get("FAKE_RUN_SLEEP", "0")))
    fail = os.environ.get("FAKE_RUN_FAIL")
    if fail and fail in str(cfg.name):
        raise RuntimeError(f"injected failure for {cfg.name}")
    k = 0 if method == "ar" else int(cfg.drafter.proposals)
    boost = {"ar": 0, "dspark": 1, "ft": 1, "placebo": 1}.get(method, 1 + (int(cfg.reader.rank) % 5 > 2) + int(cfg.seed) % 2)
    per_bench, records = [], {}
    for b, suite in enumerate(cfg.bench.suites):
        # 16 prompts a suite: 32 units a run, enough (reports.stats.MIN_DISCORDANT) for a one-run paired interval
        prompts = [[min(k, (i + j + boost + b) % (k + 1)) for i in range(6)] if k else [0] * 8 for j in range(16)]
        logs = [SequenceLog(new_tokens=1 + sum(a + 1 for a in acc), wall_s=0.5 + 0.1 * b, accepted=acc,
                            horizons=[k] * len(acc)) for acc in prompts]
        m = summarize(logs, str(suite), method, k)
        m.lossless = 1
        per_bench.append(m)
        records[str(suite)] = {"lossless": 1, "prompts": [
            {"index": j, "prompt_len": 5, "tokens": [1] * log.new_tokens, "accepted": log.accepted,
             "horizons": log.horizons, "committed": [a + 1 for a in log.accepted], "wall_s": log.wall_s,
             "ar_wall_s": 2 * log.wall_s, "lossless": 1} for j, log in enumerate(logs)]}
    total = overall(per_bench)
    curves = {} if method == "ar" else {"stage1": [(s, 2.0 / s) for s in range(1, 4)]}
    _log("end", cfg, method)
    evaluation = {"method": method, "resolved": {"device": "cpu"}, "benchmarks": records}
    if k:  # drafting rows: a teacher-forced score on held-out sequences (the search objective)
        committed = [8 * (boost + 1) + i + int(10 * float(cfg.train.loss.l1_weight)) for i in range(4)]
        evaluation["heldout_tf"] = {"split": "validation", "proposals": k, "num_sequences": 4,
                                    "sequences": {"committed": committed, "blocks": [8] * 4},
                                    "tau": sum(committed) / 32}
    return VariantResult(method=method, benchmarks=per_bench, overall=total, curves=curves,
                         resolved={"state_layers": [1, 3], "context_layers": [0, 2], "inject_layers": [1],
                                   "rank": min(int(cfg.reader.rank), 64)},
                         evaluation=evaluation)
