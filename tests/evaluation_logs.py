"""Hand-built evaluation.json logs (the shape `sweeps.row` writes) for the statistics and report
tests. Prompts have a fixed difficulty; each row draws its own rounds independently, so two rows
differ by round-level noise the way two drafters on the same prompts do. This file holds no tests."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

K = 7  # block size


def difficulty(n_prompts: int) -> np.ndarray:
    """Per-prompt acceptance probability, the same for every row (prompt i is prompt i)."""
    return np.random.default_rng(123).uniform(0.55, 0.85, size=n_prompts)


def draw_rounds(rng: np.random.Generator, p: float, n_rounds: int, k: int = K) -> list[int]:
    """Accepted drafts per round: A ~ min(K, Geometric(1 - p) - 1)."""
    return [int(min(k, rng.geometric(1 - p) - 1)) for _ in range(n_rounds)]


def record(index: int, accepted: Sequence[int], k: int = K, wall_s: float = 0.1,
           horizons: Optional[Sequence[int]] = None, with_committed: bool = True) -> dict:
    """One prompt record: every round commits A + 1 tokens after the prefill token."""
    committed = [a + 1 for a in accepted]
    rec = {"index": index, "prompt_len": 5, "tokens": [1] * (1 + sum(committed)), "accepted": list(accepted),
           "horizons": list(horizons) if horizons is not None else [k] * len(accepted),
           "wall_s": wall_s, "ar_wall_s": 2 * wall_s, "lossless": 1}
    if with_committed:
        rec["committed"] = committed
    return rec


def shift_to_tau(rounds: list[list[int]], target_committed: int, rng: np.random.Generator, k: int = K) -> None:
    """Nudge single rounds by ±1 accepted draft until Σ(A + 1) over all prompts equals the target."""
    total = sum(a + 1 for r in rounds for a in r)
    cells = [(i, j) for i, r in enumerate(rounds) for j in range(len(r))]
    while total != target_committed:
        step = 1 if target_committed > total else -1
        i, j = cells[rng.integers(len(cells))]
        if 0 <= rounds[i][j] + step <= k:
            rounds[i][j] += step
            total += step


def bench_rounds(seed: int, n_prompts: int, n_rounds: int, gain: float = 0.0,
                 reference: Optional[list[list[int]]] = None) -> list[list[int]]:
    """Rounds of one row on one benchmark; with `reference`, Σ(A + 1) is exactly (1 + gain) × the
    reference's (the same number of rounds), i.e. a τ gain of exactly `gain`."""
    rng = np.random.default_rng(seed)
    rounds = [draw_rounds(rng, p, n_rounds) for p in difficulty(n_prompts)]
    if reference is not None:
        ref = sum(a + 1 for r in reference for a in r)
        shift_to_tau(rounds, round(ref * (1 + gain)), rng)
    return rounds


def evaluation(method: str, benchmarks: dict[str, list[list[int]]], *, device: str = "cpu", k: int = K,
               wall_s: float = 0.1, swapped: Optional[dict[str, list[list[int]]]] = None,
               heldout: Optional[tuple[list[int], list[int]]] = None, lossless: int = 1) -> dict:
    """An evaluation.json dict: per benchmark, one record per prompt's rounds."""
    out = {"method": method, "config": {"drafter": {"proposals": k}}, "resolved": {"device": device},
           "overall": {"lossless": lossless}, "benchmarks": {}}
    for name, rounds in benchmarks.items():
        b = {"metrics": {"proposals": k}, "lossless": lossless,
             "prompts": [record(i, r, k, wall_s) for i, r in enumerate(rounds)]}
        if swapped and name in swapped:
            b["state_swap"] = {"prompts": [record(i, r, k, wall_s) for i, r in enumerate(swapped[name])]}
        out["benchmarks"][name] = b
    if heldout is not None:
        committed, blocks = heldout
        out["heldout_tf"] = {"split": "validation", "proposals": k, "num_sequences": len(blocks),
                             "sequences": {"committed": list(committed), "blocks": list(blocks)},
                             "tau": sum(committed) / sum(blocks)}
    return out


def metrics_of(ev: dict) -> dict[str, float]:
    """The MLflow metrics `sweeps.row` would log for this evaluation (per benchmark and overall)."""
    from ready.metrics import SequenceLog, overall, summarize

    k = int(ev["config"]["drafter"]["proposals"]) if ev["method"] != "ar" else 0
    per_bench = []
    for name, b in ev["benchmarks"].items():
        logs = [SequenceLog(new_tokens=len(p["tokens"]), wall_s=p["wall_s"], accepted=p["accepted"],
                            horizons=p["horizons"]) for p in b["prompts"]]
        m = summarize(logs, name, ev["method"], k)
        m.lossless = b["lossless"]
        per_bench.append(m)
    out: dict[str, float] = {}
    for m in [*per_bench, overall(per_bench)]:
        out.update(m.mlflow_metrics())
    return out


def crossed_pair(n_seeds: int, n_prompts: int, n_rounds: int, *, gain: float = 0.0, sd_seed: float = 0.0,
                 sd_prompt: float = 0.0, sd_unit: float = 0.0, seed: int = 0,
                 effects: Optional[dict] = None) -> tuple[list[dict], list[dict]]:
    """(reference evaluations, row evaluations), one per seed, on one benchmark "b", built so that the row's
    τ on unit (seed s, prompt i) is the reference's × (1 + gain + a_s + b_i + e_si), with a_s ~ N(0, sd_seed),
    b_i ~ N(0, sd_prompt), e_si ~ N(0, sd_unit): a crossed design with known variance components (relative
    gains, not percent). Both rows run the same rounds on a unit; `effects` (a dict) receives a, b and e."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0, sd_seed, n_seeds)
    b = rng.normal(0, sd_prompt, n_prompts)
    e = rng.normal(0, sd_unit, (n_seeds, n_prompts))
    if effects is not None:
        effects.update(a=a, b=b, e=e)
    refs, rows = [], []
    for s in range(n_seeds):
        ref = [draw_rounds(rng, p, n_rounds) for p in difficulty(n_prompts)]
        row = []
        for i, r in enumerate(ref):
            mine = list(r)
            shift_to_tau([mine], round(sum(x + 1 for x in r) * (1 + gain + a[s] + b[i] + e[s, i])), rng)
            row.append(mine)
        refs.append(evaluation("dspark", {"b": ref}))
        rows.append(evaluation("ready", {"b": row}))
    return refs, rows
