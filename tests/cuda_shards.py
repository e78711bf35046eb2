"""Run the CUDA tests (`pytest -m cuda`) in shards of at most ~5 minutes each, one line per shard.

The whole `-m cuda` suite runs longer than one device call comfortably holds, so it is split by the
durations last measured on a GPU (tests/cuda_durations.json, written by `--record`, names the card): files are
packed greedily, longest first, into as few shards as keep each under `--budget` seconds (a file
longer than the budget is split by test). A test with no measured duration counts `DEFAULT_S`.
Each shard runs in its own pytest process (CUDA state does not leak between shards).

    python tests/cuda_shards.py --list                 # the plan: shards, files, estimated seconds
    python tests/cuda_shards.py                        # every shard, one pass/fail line each
    python tests/cuda_shards.py --shard 2              # one shard (e.g. one device call per shard)
    python tests/cuda_shards.py --shard 2 --timeout 500  # past 500 s: Ctrl-C (<= 30 s more), TIMEOUT, the tests it finished
                                                         # (judged on its report if pytest had already summed up)
    python tests/cuda_shards.py --record tests/cuda_durations.json --json $OUT/cuda.json

Run shards one after another (or one per device call): shards sharing one GPU ran past their estimates,
one after another they kept them (an H100, 6 Dec). The latest runs: docs/figures.md "Where the CUDA tests
stand".

Exit status 0 only when every shard that ran passed (a skipped test is not a pass: on a machine
without CUDA every test skips, and the line says so).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = Path(__file__).resolve().parent / "cuda_durations.json"
BUDGET_S = 300.0  # 5 minutes of measured test time at most; cold (compiling, tuning) a shard of ~300 s ran past 340 s
DEFAULT_S = 30.0  # a test never timed counts this long
INTERRUPT_GRACE_S = 30.0  # a shard past its timeout gets this long to stop after Ctrl-C before it is killed


@dataclass
class Shard:
    """Node ids (whole files where a file fits) and their estimated seconds."""

    items: list[str] = field(default_factory=list)
    seconds: float = 0.0


def marked_files(paths: list[str]) -> list[str]:
    """The test files under `paths` (files or folders, relative to the repository) that mark CUDA tests
    (`mark.cuda` in their source). Only these are collected: a GPU image need not have what the other
    files import (optuna, mlflow, ...), and their import errors would stop the collection."""
    found = []
    for p in paths:
        path = ROOT / p
        files = sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
        for f in files:
            if not f.is_file():
                raise SystemExit(f"error: {p}: no such test file or folder")
            if "mark.cuda" in f.read_text(encoding="utf-8"):
                found.append(str(f.relative_to(ROOT)))
    return found


def collect(paths: list[str]) -> list[str]:
    """Node ids of the CUDA tests in the files under `paths` that mark any (collection works without CUDA)."""
    files = marked_files(paths)
    if not files:
        return []
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-m", "cuda", *files],
                         cwd=ROOT, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if out.returncode not in (0, 5) or (out.returncode == 0 and not ids):
        raise SystemExit(f"error: collecting the CUDA tests failed (pytest exit {out.returncode}):\n"
                         f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return ids


def load_durations(path: Path) -> dict[str, float]:
    """Measured seconds per node id ({} when the file does not exist yet)."""
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {str(k): float(v) for k, v in raw["tests"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"error: {path}: expected {{\"tests\": {{node id: seconds}}}} ({type(e).__name__}: {e})")


def plan(ids: list[str], durations: dict[str, float], budget: float) -> list[Shard]:
    """As few shards as greedy longest-first packing of files under `budget` needs (a file alone past it is
    split by test), the files then spread longest-first over that many shards, each to the least loaded
    one: shards of about equal length, so each keeps room for its process's compile and tuning time, which
    the per-test durations do not fully hold."""
    by_file: dict[str, list[str]] = {}
    for node in ids:
        by_file.setdefault(node.split("::", 1)[0], []).append(node)
    units: list[tuple[float, list[str]]] = []
    for path, nodes in by_file.items():
        cost = [durations.get(n, DEFAULT_S) for n in nodes]
        if sum(cost) <= budget:
            units.append((sum(cost), [path]))
        else:
            units += [(c, [n]) for c, n in zip(cost, nodes)]
    shards: list[Shard] = []
    for seconds, items in sorted(units, key=lambda u: -u[0]):
        fits = [s for s in shards if s.seconds + seconds <= budget]
        target = min(fits, key=lambda s: s.seconds) if fits else None
        if target is None:
            target = Shard()
            shards.append(target)
        target.items += items
        target.seconds += seconds
    if not shards:
        return shards
    even = [Shard() for _ in shards]
    for seconds, items in sorted(units, key=lambda u: -u[0]):
        target = min(even, key=lambda s: s.seconds)
        target.items += items
        target.seconds += seconds
    return even if max(s.seconds for s in even) <= max(s.seconds for s in shards) else shards


def _junit(path: Path) -> list[dict]:
    """(node id, outcome, seconds) of every test case in a pytest JUnit XML file (xunit1: with `file`)."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file, classname = case.get("file", ""), case.get("classname", "")
        module = file[:-3].replace("/", ".") if file.endswith(".py") else classname
        inner = classname[len(module) + 1:].replace(".", "::") if classname.startswith(module + ".") else ""
        node = f"{file}::{inner + '::' if inner else ''}{case.get('name', '')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        cases.append({"id": node, "outcome": outcome, "seconds": float(case.get("time", 0.0))})
    return cases


_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped"}
_SUMMARY = re.compile(r"^=+ .* in [0-9.]+s\b.*=+$", re.M)  # pytest's closing line: "=== 23 passed ... in 271.82s ==="
_INTERRUPTED = re.compile(r"^!+ KeyboardInterrupt !+$", re.M)  # what pytest prints when Ctrl-C stops its tests


def _verbose_outcomes(text: str) -> list[dict]:
    """(node id, outcome) of the tests a `pytest -v` run reported before it was stopped."""
    cases = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "::" in parts[0] and parts[1] in _OUTCOMES:
            cases.append({"id": parts[0], "outcome": _OUTCOMES[parts[1]], "seconds": None})  # not timed
    return cases


def run_shard(index: int, total: int, shard: Shard, extra: list[str], timeout: float | None = None) -> dict:
    """Run one shard in its own pytest process; print its line; return its record. Past `timeout`
    seconds the process is interrupted (as by Ctrl-C, then killed if it does not stop) and the line says
    TIMEOUT, with the tests it finished and, where pytest could still write its report, their seconds;
    unless pytest had already printed its closing summary (every test had ended; the process was still
    exiting), when the shard is judged on its report and the record says `ended_at_exit`."""
    timed_out = False
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        # -vv: one line per test (what a stopped shard is read from) even under the project's addopts -q
        cmd = [sys.executable, "-m", "pytest", "-vv", "-m", "cuda", f"--junitxml={xml}", "-o", "junit_family=xunit1",
               *extra, *shard.items]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            timed_out, code = True, -1
            proc.send_signal(signal.SIGINT)  # pytest stops as on Ctrl-C and still writes the JUnit XML (durations)
            try:
                out, err = proc.communicate(timeout=INTERRUPT_GRACE_S)
            except subprocess.TimeoutExpired:  # stuck where Ctrl-C is not seen (inside a CUDA call)
                proc.kill()
                out, err = proc.communicate()
        wall = time.perf_counter() - start
        cases = _junit(xml) if xml.is_file() else []
        at_exit = (timed_out and xml.is_file() and _SUMMARY.search(out) is not None
                   and _INTERRUPTED.search(out) is None)
        if timed_out and not at_exit:  # the report lists the test Ctrl-C stopped as passed: keep the -vv lines' outcomes
            timed = {c["id"]: c["seconds"] for c in cases}
            cases = [{**c, "seconds": timed.get(c["id"])} for c in _verbose_outcomes(out)]
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    clean = code == 0 or at_exit
    ok = clean and counts["failed"] == 0 and counts["passed"] > 0
    verdict = ("TIMEOUT" if timed_out and not at_exit else "PASS" if ok
               else ("SKIP" if clean and counts["passed"] == 0 else "FAIL"))
    late = f" (the {timeout:g} s limit came while pytest exited, after its summary)" if at_exit else ""
    print(f"shard {index}/{total}: {verdict} {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped in {wall:.0f} s{late} (estimated {shard.seconds:.0f} s): {' '.join(shard.items)}",
          flush=True)
    if verdict in ("FAIL", "TIMEOUT"):
        print(out[-4000:] + err[-2000:], flush=True)
    return {"shard": index, "verdict": verdict, "wall_s": round(wall, 1), "estimated_s": round(shard.seconds, 1),
            "items": shard.items, **counts, **({"ended_at_exit": True} if at_exit else {}), "cases": cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", default=["tests"], help="test files or folders (default: tests)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds per shard (default %(default)s)")
    ap.add_argument("--durations", type=Path, default=DURATIONS, help="measured durations (default %(default)s)")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    ap.add_argument("--shard", type=int, help="run only this shard (1-based)")
    ap.add_argument("--record", type=Path, help="write the measured durations here (merged with --durations)")
    ap.add_argument("--json", type=Path, help="write every shard's record here")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a shard may run; past it the shard stops and its line says TIMEOUT")
    a, extra = ap.parse_known_args(argv)
    if a.budget <= 0:
        raise SystemExit(f"error: --budget must be > 0 seconds, got {a.budget}")

    durations = load_durations(a.durations)
    shards = plan(collect(a.paths), durations, a.budget)
    if a.list:
        for i, s in enumerate(shards, 1):
            print(f"shard {i}/{len(shards)}: ~{s.seconds:.0f} s: {' '.join(s.items)}")
        return 0
    if a.shard is not None and not 1 <= a.shard <= len(shards):
        raise SystemExit(f"error: --shard must be 1..{len(shards)}, got {a.shard}")
    chosen = [a.shard] if a.shard else list(range(1, len(shards) + 1))
    if a.timeout is not None and a.timeout <= 0:
        raise SystemExit(f"error: --timeout must be > 0 seconds, got {a.timeout}")
    records = [run_shard(i, len(shards), shards[i - 1], extra, a.timeout) for i in chosen]

    if a.record:
        measured = {c["id"]: c["seconds"] for r in records  # a stopped shard's finished tests too, where timed
                    for c in r["cases"] if c["outcome"] != "skipped" and c["seconds"] is not None}
        a.record.write_text(json.dumps({"device": _device(), "tests": dict(sorted({**durations, **measured}.items()))},
                                       indent=1) + "\n")
    if a.json:
        a.json.write_text(json.dumps({"device": _device(), "shards": records}, indent=1) + "\n")
    return 0 if all(r["verdict"] == "PASS" for r in records) else 1


def _device() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
