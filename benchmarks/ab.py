"""Paired A/B of source trees (a code change against the code before it) over fresh engine-benchmark
(or step-trace) processes; a variant may also set environment variables of the stack below us (torch,
Triton, CUDA).

    git worktree add ../before HEAD~1
    python -m benchmarks.ab --variant before --tree before=../before --variant after \\
        --rounds 3 --out ab_runs -- --target qwen3_5_27b \\
        --prompt-len 256 --new-tokens 192 --repeats 3 --verify-iters 10 --verify-tokens ""

Code paths of this project are chosen by its config and code, never by the environment: a switch to
A/B is a change between two trees.

The unit is a process: compilation and the kernel tuners' choices happen once per process, and
processes on one machine differ by more than the repeats inside one (docs/figures.md, "Conventions").
Each round runs every variant once, in a fresh `python -m benchmarks.engine` process with the
variant's tree and environment, the order reversed every other round so drift over the machine's lifetime
falls on all variants alike. A difference pairs the rounds in which both of its processes finished;
the exit code is 1 when any process failed (its reason and stderr tail are in its JSON).

Output (JSON on stdout and `<out>/ab.json`): per variant and process the engine figures (AR decode
tok/s, engine step, verify of 1 and K+1 tokens, their ratio, the tuners' timer; `--metric` adds
any dotted path of the engine JSON); per metric and variant after the first, the per-round
difference variant − first, its mean and a 95 % t interval over the rounds (paired: same round,
same machine; none with one round). Each process's own JSON goes to `<out>/<variant>_<round>.json`
as it ends, so a run stopped by a time limit keeps what finished.

`--budget SECONDS` bounds the whole A/B (e.g. a device command's limit less a margin): a round that
would end past it, judged by the slowest process so far after the first (which pays the cold caches),
is not started, and the summary of the rounds that ran is written as usual (`stopped` says why it
ended early).

`--bench step_trace` runs `python -m benchmarks.step_trace` instead of the engine benchmark (give the
figures to compare with `--metric`), e.g. a change to the draft step, paired over fresh processes:

    python -m benchmarks.ab --bench step_trace --variant after --variant before --tree before=../before \\
        --metric b1_ms=steps.0.replay_ms --metric b32_ms=steps.1.replay_ms --rounds 3 --out ab_draft \\
        -- --draft dspark --batch 1,32 --replays 10

`--pool DIR [DIR ...]` writes one summary of several A/B folders of the same variants, benchmark and
arguments (e.g. one per device call, when a call holds only two rounds): their rounds in turn, each difference still
paired within its round.

`--tree NAME=PATH` runs variant NAME from another source tree of this project (another commit's
`ready/`, `benchmarks/`, `kernels/` and `experiments/`, e.g. `git worktree add ../old HEAD~1` or `git archive
<commit> ready benchmarks kernels experiments`): its processes import `ready` and `benchmarks` from PATH and
`ready_kernels` from PATH/kernels, and read presets and base.yaml from PATH/experiments, whose keys follow that
commit's config schema (the engine JSON's `source` says which tree ran), so a code change is A/B'd against
the code before it in the same paired rounds. A tree from before issue 76, whose benchmarks were
`ready/bench/`, runs as it is: that folder is linked in as `benchmarks`. The engine arguments after `--` go to
every tree as they are: until issue 76 item 2 the engine benchmark took its config keys as flags (`-k`,
`--device`, `--dtype`, `--compile`, `--temperature`, ...), since then as `a.b=v` overrides (`drafter.proposals=7`,
...), and its default K for the qwen3_5_27b preset went from the flag's 7 to the preset's 6: an A/B across that
change takes neither (the old tree refuses overrides, the new one the flags), and the 27B's K differs there.
So does `--bench step_trace`'s (`-k` and `--dtype` gave way to `drafter.proposals` and `target.dtype`; its draft
step's default K for the qwen3_5_27b preset went from 7 to 6: the draft trace of docs/figures.md says
`drafter.proposals=7`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ready.artifacts import atomic_write_text
from ready.config import entry_point
from reports.stats import mean_interval

# dotted paths into the engine JSON (benchmarks/engine.py), reported for every process
METRICS = {
    "ar_tok_s": "ar.decode_tokens_per_s",
    "ar_step_ms": "ar.step_ms",
    "verify1_ms": "verify.step_ms",
    "verify_k_ms": "verify.verify_ms",
    "verify_ratio": "verify.ratio",
}
BENCHES = ("engine", "step_trace")  # `--bench`: the module of benchmarks each process runs
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def default_metrics(bench: str) -> dict[str, str]:
    """The figures compared without a --metric: the engine's METRICS; none for other benchmarks."""
    return dict(METRICS) if bench == "engine" else {}


class ABError(ValueError):
    """A bad A/B request; the message names the argument and what was expected."""


def parse_variant(words: Sequence[str]) -> tuple[str, dict[str, str]]:
    """`NAME [VAR=value ...]` -> (name, environment). A variant with no assignments runs the
    environment as it is (a baseline)."""
    if not words or not _NAME.match(words[0]):
        raise ABError(f"--variant {' '.join(words)!r}: expected a name of letters, digits, '_' or '-', "
                      "then VAR=value assignments, e.g. --variant serial CUDA_LAUNCH_BLOCKING=1")
    env = {}
    for w in words[1:]:
        if not _ENV.match(w):
            raise ABError(f"--variant {words[0]}: {w!r} is not a VAR=value assignment")
        key, value = w.split("=", 1)
        env[key] = value
    return words[0], env


def tree_root(name: str, tree: Path) -> Path:
    """The resolved source tree of `--tree name=tree`; refused unless it holds this project's code."""
    root = tree.expanduser().resolve()
    if bench_folder(root) is None or not (root / "kernels").is_dir():
        raise ABError(f"--tree {name}={tree}: expected a source tree of this project "
                      "(with benchmarks/engine.py, or ready/bench/engine.py before issue 76, and kernels/)")
    return root


def bench_folder(root: Path) -> Optional[Path]:
    """The benchmarks of the source tree `root`: benchmarks/, or ready/bench/ in a tree from before issue 76
    (None when it has neither)."""
    return next((f for f in (root / "benchmarks", root / "ready" / "bench") if (f / "engine.py").is_file()), None)


def tree_env(root: Path, links: Path) -> dict[str, str]:
    """The environment in which `python -m benchmarks.engine` imports `ready` and `benchmarks` from the
    source tree `root` and `ready_kernels` from root/kernels, linked under `links` (a folder of the variant's
    own), as is an older tree's ready/bench as `benchmarks`. PYTHONSAFEPATH keeps `python -m` from putting
    the working folder, this tree, first."""
    links.mkdir(parents=True, exist_ok=True)
    for name, target in (("ready_kernels", root / "kernels"), ("benchmarks", bench_folder(root))):
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        if target is not None and target != root / name:  # a tree's own benchmarks/ is found on PYTHONPATH
            link.symlink_to(target, target_is_directory=True)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join([str(root), str(links), *rest])}


def lookup(doc: Any, path: str) -> Optional[float]:
    """The number at a dotted path (list items by index), or None where the path is absent."""
    for part in path.split("."):
        if isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            return None
    return float(doc) if isinstance(doc, (int, float)) and not isinstance(doc, bool) else None


def paired_interval(diffs: Sequence[float]) -> Optional[dict[str, float]]:
    """Mean of paired differences and its 95 % t interval; None for fewer than two pairs."""
    iv = mean_interval(diffs)
    return None if iv is None else {"mean": iv[0], "lo": iv[1], "hi": iv[2]}


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The variants of round r (0-based): as given in even rounds, reversed in odd ones."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def process_estimate(walls: Sequence[float]) -> float:
    """Seconds to allow a further process: the slowest so far after the first. The A/B's first process
    pays the machine's cold caches (compiles, kernel tuning) and runs clearly longer than the processes
    after it, so counting it would refuse a round that a cold call still holds."""
    return max(walls[1:] if len(walls) > 1 else walls)


def round_fits(elapsed: float, walls: Sequence[float], processes: int, budget: Optional[float]) -> bool:
    """Whether a round of `processes` more processes, each taking `process_estimate(walls)`, ends within
    `budget` seconds of the A/B's start (always with no budget, or before the first process)."""
    return budget is None or not walls or elapsed + processes * process_estimate(walls) <= budget


def output_json(stdout: str) -> Optional[dict[str, Any]]:
    """The JSON object a benchmark prints last: its last line (the engine's one-line --json) or the whole
    output (step_trace's indented document); None when neither parses to an object."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    for text in (lines[-1] if lines else "", stdout):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def run_process(engine_args: Sequence[str], env: dict[str, str], timeout: Optional[float],
                bench: str = "engine") -> dict[str, Any]:
    """One benchmark (`benchmarks.<bench>`) in a fresh process: its JSON, or {"failed": why, "stderr": tail}."""
    cmd = [sys.executable, "-m", f"benchmarks.{bench}", *engine_args, "--json"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"failed": f"timed out after {timeout:g} s", "stderr": err[-2000:]}
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"failed": f"exit code {proc.returncode}", "stderr": proc.stderr[-2000:]}
    doc = output_json(proc.stdout)
    if doc is None:
        return {"failed": "its output does not end in a JSON object", "stderr": proc.stderr[-2000:]}
    doc["process_wall_s"] = wall
    return doc


def summarize(names: Sequence[str], runs: dict[str, list[Optional[dict]]], metrics: dict[str, str]) -> dict[str, Any]:
    """Per-process figures and, per metric, the paired differences against the first variant over
    the rounds in which both processes finished."""
    ok = {n: [d is not None and "failed" not in d for d in runs[n]] for n in names}
    per_variant = {n: [{**{m: lookup(d, p) for m, p in metrics.items()},
                        "tune_timer": (d.get("small_m") or {}).get("timer")} if good else None
                       for d, good in zip(runs[n], ok[n])] for n in names}
    diffs: dict[str, dict[str, Any]] = {}
    ref = names[0]
    for m in metrics:
        for n in names[1:]:
            both = [r for r, (a, b) in enumerate(zip(per_variant[n], per_variant[ref]))
                    if a and b and a[m] is not None and b[m] is not None]
            d = [per_variant[n][r][m] - per_variant[ref][r][m] for r in both]
            diffs.setdefault(m, {})[f"{n} - {ref}"] = {"rounds": both, "per_round": d, "interval": paired_interval(d)}
    failed = {n: {r: runs[n][r]["failed"] for r in range(len(runs[n])) if runs[n][r] and not ok[n][r]} for n in names}
    return {"variants": list(names), "rounds": len(runs[ref]), "per_process": per_variant,
            "differences": diffs, "failed": {n: f for n, f in failed.items() if f}}


def run_ab(variants: dict[str, dict[str, str]], engine_args: Sequence[str], rounds: int, out: Path,
           metrics: dict[str, str], timeout: Optional[float] = None, budget: Optional[float] = None,
           clock: Callable[[], float] = time.perf_counter, bench: str = "engine") -> dict[str, Any]:
    """Run `rounds` rounds of every variant (`benchmarks.<bench>` with `engine_args`), writing each
    process's JSON and the summary under `out`.
    With `budget` (seconds), a round that would not end within it is not started (`round_fits`): an
    unpaired process costs device time and adds nothing, and the summary is written either way."""
    names = list(variants)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Optional[dict]]] = {n: [None] * rounds for n in names}
    order: list[list[str]] = []
    total, done, walls, start, stopped = rounds * len(names), 0, [], clock(), None
    for r in range(rounds):
        if not round_fits(clock() - start, walls, len(names), budget):
            stopped = (f"after {r} of {rounds} rounds: {len(names)} more processes of ~{process_estimate(walls):.0f} s "
                       f"would end past --budget {budget:g} s")
            print(f"[ab] stopped {stopped}", file=sys.stderr, flush=True)
            break
        order.append(round_order(names, r))
        for n in order[-1]:
            done += 1
            t0 = clock()
            doc = run_process(engine_args, variants[n], timeout, bench)
            walls.append(clock() - t0)
            runs[n][r] = doc
            atomic_write_text(out / f"{n}_{r}.json", json.dumps(doc, indent=1) + "\n")
            shown = ", ".join(f"{m} {lookup(doc, path) or float('nan'):.4g}" for m, path in list(metrics.items())[:3])
            figure = f"failed: {doc['failed']}" if "failed" in doc else f"{shown}, {walls[-1]:.0f} s"
            print(f"[{done}/{total}] round {r} {n}: {figure}", file=sys.stderr, flush=True)
    res = {"bench": bench, "engine_args": list(engine_args), "env": variants, "order": order, "metrics": metrics,
           **summarize(names, runs, metrics), "rounds_run": len(order), "stopped": stopped}
    atomic_write_text(out / "ab.json", json.dumps(res, indent=1) + "\n")
    return res


def _process_json(path: Path) -> Optional[dict]:
    """A process's JSON as run_ab wrote it; None where that process never ran."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ABError(f"--pool: {path} is not JSON ({e})") from None


def pool(folders: Sequence[Path], out: Path, extra: dict[str, str]) -> dict[str, Any]:
    """One summary of A/B folders of the same variants, benchmark and arguments: every folder's rounds in
    turn (a difference stays paired within its round), written to `out`/ab.json. A folder may list the
    variants in another order (a call that opened with the other variant, so drift falls on both alike
    across calls); the first folder's first variant is the reference. The metrics are those the folders
    recorded (the engine's defaults for a folder that predates the record) and `extra`."""
    if any(f.resolve() == out.resolve() for f in folders):
        raise ABError(f"--out {out}: one of the pooled folders (its ab.json would be overwritten); give a new folder")
    names: Optional[list[str]] = None
    engine_args: list[str] = []
    bench = "engine"
    runs: dict[str, list[Optional[dict]]] = {}
    calls = []
    metrics: dict[str, str] = {}
    for f in folders:
        if not (f / "ab.json").is_file():
            raise ABError(f"--pool {f}: no ab.json there (expected a folder written by python -m benchmarks.ab)")
        doc = json.loads((f / "ab.json").read_text())
        if names is None:
            names, engine_args, bench = list(doc["variants"]), list(doc["engine_args"]), doc.get("bench", "engine")
        elif (sorted(doc["variants"]) != sorted(names) or list(doc["engine_args"]) != engine_args
              or doc.get("bench", "engine") != bench):
            raise ABError(f"--pool {f}: its variants, benchmark or engine arguments differ from {folders[0]}'s "
                          "(pool only runs of one A/B)")
        metrics = {**(doc.get("metrics") or default_metrics(bench)), **metrics}
        for n in names:
            runs.setdefault(n, []).extend(_process_json(f / f"{n}_{r}.json") for r in range(doc["rounds_run"]))
        calls.append({"folder": str(f), "rounds": doc["rounds_run"], "order": doc["order"]})
    assert names is not None  # argparse gives --pool at least one folder
    metrics = {**metrics, **extra}
    res = {"bench": bench, "engine_args": engine_args, "pooled": calls, "metrics": metrics, **summarize(names, runs, metrics)}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "ab.json", json.dumps(res, indent=1) + "\n")
    return res


@entry_point
def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    engine_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.splitlines()[0],
                                 epilog="Arguments after -- go to python -m benchmarks.<--bench>.")
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME [VAR=value]",
                    help="a variant's name and environment (give two or more; the first is the reference)")
    ap.add_argument("--bench", choices=BENCHES, default=None,
                    help="the benchmark each process runs (default engine; step_trace: give --metric)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per variant (default 2)")
    ap.add_argument("--out", required=True, help="folder for each process's JSON and ab.json")
    ap.add_argument("--metric", action="append", default=[], metavar="NAME=PATH",
                    help="also report this dotted path of the engine JSON, e.g. tps=forced.0.decode_tokens_per_s")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per process (default none)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole A/B: a round that would end past it is not started, judged by "
                         "the slowest process so far after the first (e.g. a device command's time limit less a margin)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="run variant NAME from another source tree of this project (e.g. a worktree of an "
                         "earlier commit)")
    ap.add_argument("--pool", nargs="+", type=Path, metavar="DIR",
                    help="summarize these A/B folders (of the same variants and engine arguments) as one A/B "
                         "instead of running one")
    a = ap.parse_args(own)
    try:
        extra: dict[str, str] = {}
        for spec in a.metric:
            name, sep, path = spec.partition("=")
            if not sep or not _NAME.match(name) or not path:
                raise ABError(f"--metric {spec!r}: expected NAME=dotted.path, e.g. tps=forced.0.decode_tokens_per_s")
            extra[name] = path
        if a.pool:
            if a.variant or a.tree or a.bench or engine_args:
                raise ABError("--pool: give no --variant, --tree, --bench or engine arguments (the folders name them)")
            res = pool(a.pool, Path(a.out), extra)
            print(json.dumps(res))
            return 1 if res["failed"] else 0
        bench = a.bench or "engine"
        metrics = {**default_metrics(bench), **extra}
        if not metrics:
            raise ABError(f"--bench {bench}: give at least one --metric NAME=dotted.path of its JSON, "
                          "e.g. b1_ms=steps.0.replay_ms")
        variants: dict[str, dict[str, str]] = {}
        for words in a.variant:
            name, env = parse_variant(words)
            if name in variants:
                raise ABError(f"--variant {name}: given twice")
            variants[name] = env
        if len(variants) < 2:
            raise ABError("--variant: expected at least two variants to compare")
        if a.rounds < 1:
            raise ABError(f"--rounds {a.rounds}: expected at least 1")
        if a.budget is not None and not a.budget > 0:
            raise ABError(f"--budget {a.budget:g}: expected a positive number of seconds")
        if any(w == "--out" or w.startswith("--out=") for w in engine_args):
            raise ABError("engine arguments: leave out --out (each process's JSON goes to the A/B folder)")
        trees: dict[str, Path] = {}
        for spec in a.tree:
            name, sep, path = spec.partition("=")
            if not sep or name not in variants or not path:
                raise ABError(f"--tree {spec!r}: expected NAME=PATH with NAME one of the variants "
                              f"({', '.join(variants)})")
            trees[name] = tree_root(name, Path(path))
        for name, root in trees.items():  # last: nothing is written for a request refused above
            variants[name] = {**tree_env(root, Path(a.out) / "trees" / name), **variants[name]}
    except ABError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    res = run_ab(variants, engine_args, a.rounds, Path(a.out), metrics, a.timeout, a.budget, bench=bench)
    print(json.dumps(res))
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
