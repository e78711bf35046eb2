"""Paired resampling statistics of decoding logs: intervals for τ, gains, state reliance, survival.

The unit of evidence is a prompt (docs: /work/shared/DESIGN.md, "How a table earns its numbers").
Rows of one sweep setting decode the same prompts, so a comparison of row A with row B pairs
them prompt by prompt, and seed s of A with seed s of B. A quantity is a ratio of pooled sums
(τ = Σ committed / Σ rounds over the prompts of a benchmark), so resampling works on per-prompt
sums:

- one seed: bootstrap the prompts with replacement (the same draw for A and B);
- several seeds: hierarchical bootstrap — draw seeds with replacement, then prompts within each
  drawn seed, and pool everything drawn;
- `overall` is the unweighted mean over benchmarks of the per-benchmark value (as in
  `ready.metrics.overall`); its resampling draws prompts within each benchmark (stratified).
- sampled runs (eval.temperature > 0) decode each prompt several times, sample s of prompt i with
  the same seed in every row; a prompt's samples are pooled into its unit (the prompt stays the unit
  resampled), and two runs pair only when every prompt has the same (sample, seed) set in both, so
  (prompt, sample) of A meets (prompt, sample) of B.

Point estimates are computed on the full data; intervals are 95 % percentile intervals of
N_RESAMPLES resamples from a fixed seed, so a table rebuilt from the same runs reads the same.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

N_RESAMPLES = 4000  # >= 2,000 (DESIGN.md); 4,000 keeps the 2.5 % tail at 100 resamples
SEED = 0  # resampling seed: the same runs always give the same interval
LEVEL = 0.95
OVERALL = "overall"  # mean over benchmarks, resampled within each benchmark
HELDOUT_TF = "heldout_tf"  # teacher-forced acceptance on held-out regenerated sequences


class StatsError(ValueError):
    """An evaluation log cannot be read or paired; the message names the input."""


@dataclass(frozen=True)
class Tallies:
    """Per-unit sums of one benchmark of one run (a unit is a prompt, or a held-out sequence).

    τ of any set of units is Σ committed / Σ rounds; survival P_j = Σ hits[:, j-1] / Σ observed[:, j-1];
    TPS = Σ new_tokens / Σ wall_s. `index` pairs units across runs.
    """

    index: np.ndarray  # [P] int
    committed: np.ndarray  # [P] tokens appended by the rounds (after the prefill token)
    rounds: np.ndarray  # [P] verification rounds (teacher-forced: blocks)
    hits: np.ndarray  # [P, K] rounds with A >= j among those that observed position j
    observed: np.ndarray  # [P, K] rounds with horizon >= j
    new_tokens: np.ndarray  # [P] generated tokens (prefill token included), for TPS
    wall_s: np.ndarray  # [P] decode wall time, for TPS
    ar_wall_s: Optional[np.ndarray] = None  # [P] AR's wall time on the same prompt, for the speedup
    # sampled runs: per unit, the sorted (sample, seed) pairs pooled into it (None: one greedy decode per prompt)
    samples: Optional[tuple] = None

    @property
    def size(self) -> int:
        return int(self.index.shape[0])


@dataclass(frozen=True)
class RunTallies:
    """Everything resampling needs from one run's evaluation.json."""

    benchmarks: dict[str, Tallies]
    swapped: dict[str, Tallies] = field(default_factory=dict)  # decoded with another prompt's states
    heldout_tf: Optional[Tallies] = None
    device: Optional[str] = None

    @property
    def prompts(self) -> int:
        return sum(t.size for t in self.benchmarks.values())

    @property
    def rounds(self) -> int:
        return int(sum(t.rounds.sum() for t in self.benchmarks.values()))


@dataclass(frozen=True)
class Interval:
    """A point estimate (on the full data) and its 95 % percentile interval."""

    value: float
    lo: float
    hi: float

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below 0 (an effect, not noise)."""
        return self.lo > 0 or self.hi < 0

    def clears(self, other: "Interval") -> bool:
        """True when this interval lies wholly above `other` (lower bound > other's upper bound)."""
        return self.lo > other.hi


# ---------------------------------------------------------------------------------------------
# Reading evaluation.json


def _ints(rec: Mapping[str, Any], key: str, where: str) -> np.ndarray:
    if key not in rec or not isinstance(rec[key], (list, tuple)):
        raise StatsError(f"{where}: missing list {key!r}; expected per-round lists 'accepted' and 'horizons'")
    return np.asarray(rec[key], dtype=np.int64).reshape(-1)


def _n_tokens(rec: Mapping[str, Any]) -> Optional[int]:
    """New tokens of a record: len(`tokens`), or `n_tokens` in a record slimmed of its token ids."""
    if isinstance(rec.get("tokens"), (list, tuple)):
        return len(rec["tokens"])
    return int(rec["n_tokens"]) if rec.get("n_tokens") is not None else None


def prompt_tallies(prompts: Sequence[Mapping[str, Any]], block_size: Optional[int] = None,
                   where: str = "prompts") -> Tallies:
    """Per-prompt committed tokens, rounds, survival hits/observed and timing from prompt records.

    c_i = sum(`committed`) when the record has it, else len(`tokens`) - 1 (tokens after the
    prefill token; `n_tokens` stands for len(`tokens`)); n_i = len(`accepted`). Survival over positions 1..K (K = `block_size`, else
    the largest horizon) counts only rounds whose horizon reached j (censoring, ready.metrics).
    """
    recs = list(prompts)
    acc = [_ints(r, "accepted", f"{where} prompt {r.get('index', i)}") for i, r in enumerate(recs)]
    hor = [_ints(r, "horizons", f"{where} prompt {r.get('index', i)}") for i, r in enumerate(recs)]
    for i, (a, h) in enumerate(zip(acc, hor)):
        if a.shape != h.shape:
            raise StatsError(f"{where} prompt {recs[i].get('index', i)}: {a.size} accepted values but "
                             f"{h.size} horizons; expected one of each per round")
    k = int(block_size) if block_size is not None else max((int(h.max()) for h in hor if h.size), default=0)
    js = np.arange(1, k + 1)
    committed, hits, observed = [], np.zeros((len(recs), k)), np.zeros((len(recs), k))
    for i, r in enumerate(recs):
        if isinstance(r.get("committed"), (list, tuple)):
            committed.append(float(sum(r["committed"])))
        elif _n_tokens(r) is not None:
            committed.append(float(max(_n_tokens(r) - 1, 0)))
        else:
            raise StatsError(f"{where} prompt {r.get('index', i)}: neither 'committed' nor 'tokens'; "
                             "expected the tokens each round appended")
        hits[i] = (acc[i][:, None] >= js).sum(0)
        observed[i] = (hor[i][:, None] >= js).sum(0)
    per_record = Tallies(
        index=np.asarray([int(r.get("index", i)) for i, r in enumerate(recs)], dtype=np.int64),
        committed=np.asarray(committed, dtype=float),
        rounds=np.asarray([a.size for a in acc], dtype=float),
        hits=hits,
        observed=observed,
        new_tokens=np.asarray([_n_tokens(r) or 0 for r in recs], dtype=float),
        wall_s=np.asarray([float(r.get("wall_s") or 0.0) for r in recs], dtype=float),
        ar_wall_s=np.asarray([float(r.get("ar_wall_s") or 0.0) for r in recs], dtype=float),
    )
    if not any(r.get("seed") is not None or int(r.get("sample") or 0) for r in recs):
        return per_record  # greedy: `sample: 0, seed: null` (or no such keys, as written before sampling existed)
    keys = [(int(r.get("sample") or 0), None if r.get("seed") is None else int(r["seed"])) for r in recs]
    return pool_samples(per_record, keys, where)


def pool_samples(t: Tallies, keys: Sequence[tuple], where: str = "prompts") -> Tallies:
    """One unit per prompt from per-(prompt, sample) rows: columns summed, the (sample, seed) keys kept."""
    groups: dict[int, list[int]] = {}
    for row, i in enumerate(t.index.tolist()):
        groups.setdefault(int(i), []).append(row)
    sig = []
    for i, rows in groups.items():
        ks = sorted(keys[r] for r in rows)
        if len(set(k[0] for k in ks)) != len(ks):
            raise StatsError(f"{where} prompt {i}: a sample appears twice; expected one record per (prompt, sample)")
        sig.append(tuple(ks))

    def pool(x: np.ndarray) -> np.ndarray:
        return np.stack([x[rows].sum(0) for rows in groups.values()]) if groups else x[:0]

    return Tallies(index=np.asarray(list(groups), dtype=np.int64), committed=pool(t.committed), rounds=pool(t.rounds),
                   hits=pool(t.hits), observed=pool(t.observed), new_tokens=pool(t.new_tokens), wall_s=pool(t.wall_s),
                   ar_wall_s=None if t.ar_wall_s is None else pool(t.ar_wall_s), samples=tuple(sig))


def sequence_tallies(heldout: Mapping[str, Any], where: str = HELDOUT_TF) -> Tallies:
    """Teacher-forced tallies: committed tokens and blocks per held-out sequence."""
    seqs = heldout.get("sequences")
    if not isinstance(seqs, Mapping) or "committed" not in seqs or "blocks" not in seqs:
        raise StatsError(f"{where}: expected 'sequences' with lists 'committed' and 'blocks'")
    c = np.asarray(seqs["committed"], dtype=float).reshape(-1)
    n = np.asarray(seqs["blocks"], dtype=float).reshape(-1)
    if c.shape != n.shape:
        raise StatsError(f"{where}: {c.size} 'committed' values but {n.size} 'blocks'; expected one each per sequence")
    p = c.size
    return Tallies(index=np.arange(p), committed=c, rounds=n, hits=np.zeros((p, 0)), observed=np.zeros((p, 0)),
                   new_tokens=np.zeros(p), wall_s=np.zeros(p))


def tallies(evaluation: Mapping[str, Any]) -> RunTallies:
    """Read one run's evaluation.json (as a dict) into per-prompt tallies of every benchmark."""
    if not isinstance(evaluation, Mapping):
        raise StatsError(f"evaluation: expected the evaluation.json object, got {type(evaluation).__name__}")
    benches, swapped = {}, {}
    for name, b in (evaluation.get("benchmarks") or {}).items():
        if not isinstance(b, Mapping) or not b.get("prompts"):
            continue
        k = (b.get("metrics") or {}).get("block_size")
        benches[name] = prompt_tallies(b["prompts"], k, where=f"benchmark {name!r}")
        swap = b.get("state_swap")
        if isinstance(swap, Mapping) and swap.get("prompts"):
            swapped[name] = prompt_tallies(swap["prompts"], k, where=f"benchmark {name!r} state_swap")
    tf = evaluation.get(HELDOUT_TF)
    held = sequence_tallies(tf) if isinstance(tf, Mapping) and tf.get("sequences") else None
    device = (evaluation.get("resolved") or {}).get("device")
    return RunTallies(benches, swapped, held, str(device) if device else None)


# ---------------------------------------------------------------------------------------------
# Resampling


def _counts(rng: np.random.Generator, m: int, n: int) -> np.ndarray:
    """[m, n]: how often each of n units is drawn in each of m bootstrap samples of size n."""
    idx = rng.integers(0, n, size=(m, n)) + n * np.arange(m)[:, None]
    return np.bincount(idx.ravel(), minlength=m * n).reshape(m, n)


def resampled_sums(data: Sequence[Sequence[np.ndarray]], n_resamples: int = N_RESAMPLES,
                   seed: int = SEED) -> np.ndarray:
    """[R, B, Q] pooled column sums of hierarchical bootstrap samples.

    `data[s][b]` is the [units, Q] table of seed s on stratum b. Each sample draws len(data)
    seeds with replacement, then, for every drawn seed and stratum, that stratum's units with
    replacement; the drawn rows are summed per stratum. With one seed this is the plain paired
    bootstrap of units (every column of a row moves together, so A and B stay paired).
    """
    rng = np.random.default_rng(seed)
    n_seeds, n_strata, q = len(data), len(data[0]), data[0][0].shape[1]
    out = np.zeros((n_resamples, n_strata, q))
    for _slot in range(n_seeds):
        chosen = rng.integers(0, n_seeds, size=n_resamples)
        for s in range(n_seeds):
            rows = np.flatnonzero(chosen == s)
            if rows.size == 0:
                continue
            for b in range(n_strata):
                x = data[s][b]
                if x.shape[0]:
                    out[rows, b] += _counts(rng, rows.size, x.shape[0]) @ x
    return out


def bootstrap(data: Sequence[Sequence[np.ndarray]], statistic: Callable[[np.ndarray], np.ndarray],
              n_resamples: int = N_RESAMPLES, seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point, lo, hi) of `statistic` (sums [..., B, Q] -> [..., *shape]) under `resampled_sums`."""
    full = np.sum([[x.sum(0) for x in per_seed] for per_seed in data], axis=0)  # [B, Q]
    point = statistic(full[None])[0]
    res = statistic(resampled_sums(data, n_resamples, seed))
    alpha = (1 - LEVEL) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a position no resample observed stays NaN
        lo, hi = np.nanpercentile(res, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return np.asarray(point), np.asarray(lo), np.asarray(hi)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _mean_strata(x: np.ndarray) -> np.ndarray:
    """Mean over the stratum axis (-1 for [..., B], -2 for [..., B, K]) skipping missing values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=-1)


def _as_interval(point: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Optional[Interval]:
    p, a, b = float(point), float(lo), float(hi)
    if not (math.isfinite(p) and math.isfinite(a) and math.isfinite(b)):
        return None
    return Interval(p, a, b)


# ---------------------------------------------------------------------------------------------
# Which units a key selects, and their columns


def _strata(run: RunTallies, key: str, swapped: bool = False) -> dict[str, Tallies]:
    source = run.swapped if swapped else run.benchmarks
    if key == HELDOUT_TF:
        return {} if swapped or run.heldout_tf is None else {HELDOUT_TF: run.heldout_tf}
    if key == OVERALL:
        return dict(source)
    return {key: source[key]} if key in source else {}


def _aligned(a: Tallies, b: Tallies, where: str) -> Tallies:
    """`b` reordered to `a`'s units; StatsError when the two runs did not decode the same units (prompts,
    and for sampled runs the same (sample, seed) set of every prompt)."""
    if a.size == b.size and np.array_equal(a.index, b.index):
        out = b
    else:
        if a.size != b.size or set(a.index.tolist()) != set(b.index.tolist()):
            raise StatsError(f"{where}: the runs decoded different prompts ({a.size} vs {b.size}); expected the "
                             "same prompts in both rows (runs of one sweep setting)")
        pos = {int(i): k for k, i in enumerate(b.index)}
        order = np.asarray([pos[int(i)] for i in a.index])
        out = Tallies(a.index, b.committed[order], b.rounds[order], b.hits[order], b.observed[order],
                      b.new_tokens[order], b.wall_s[order], None if b.ar_wall_s is None else b.ar_wall_s[order],
                      None if b.samples is None else tuple(b.samples[k] for k in order))
    if a.samples != out.samples:
        raise StatsError(f"{where}: the runs decoded different samples of their prompts (one greedy, or other "
                         "samples or seeds); expected the same eval.temperature, eval.samples_per_prompt and "
                         "eval.sample_seed in both rows")
    return out


def _columns(t: Tallies, what: str, k: int = 0) -> np.ndarray:
    if what == "tau":
        return np.stack([t.committed, t.rounds], axis=1)
    if what == "tps":
        return np.stack([t.new_tokens, t.wall_s], axis=1)
    if what == "speedup":  # the row's and AR's TPS on the same prompts (the same tokens: lossless)
        ar = t.ar_wall_s if t.ar_wall_s is not None else np.zeros_like(t.wall_s)
        return np.stack([t.new_tokens, t.wall_s, t.new_tokens, ar], axis=1)
    pad = ((0, 0), (0, k - t.hits.shape[1]))
    return np.concatenate([np.pad(t.hits, pad), np.pad(t.observed, pad)], axis=1)


def _names(runs: Sequence[RunTallies], key: str, swapped: bool = False) -> Optional[list[str]]:
    """Stratum names shared by every run, or None when a run lacks them (nothing to compute)."""
    sets = [list(_strata(r, key, swapped)) for r in runs]
    if not runs or not sets[0] or any(sorted(s) != sorted(sets[0]) for s in sets):
        return None
    return sorted(sets[0])


def _paired_data(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str, what: str,
                 b_swapped: bool = False) -> Optional[list[list[np.ndarray]]]:
    if len(a) != len(b):
        raise StatsError(f"{key}: {len(a)} runs of one row against {len(b)} of the other; expected one pair per seed")
    names = _names(a, key)
    if names is None or _names(b, key, b_swapped) != names:
        return None
    data = []
    for s, (ra, rb) in enumerate(zip(a, b)):
        sa, sb = _strata(ra, key), _strata(rb, key, b_swapped)
        data.append([np.concatenate([_columns(sa[n], what), _columns(_aligned(sa[n], sb[n], f"{n} (pair {s})"), what)],
                                    axis=1) for n in names])
    return data


def _tau_of(sums: np.ndarray, c: int = 0, n: int = 1) -> np.ndarray:
    return _mean_strata(_ratio(sums[..., c], sums[..., n]))


# ---------------------------------------------------------------------------------------------
# Public statistics (runs: one RunTallies per seed; pairs: seed s of A with seed s of B)


def tau(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """A row's own τ (pooled over prompts and seeds) on `key` (benchmark, OVERALL or HELDOUT_TF)."""
    names = _names(runs, key)
    if names is None:
        return None
    data = [[_columns(_strata(r, key)[n], "tau") for n in names] for r in runs]
    return _as_interval(*bootstrap(data, _tau_of))


def gain_pct(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str, metric: str = "tau") -> Optional[Interval]:
    """Paired gain of row A over row B in percent, 100 (τ_A / τ_B - 1) (metric "tps": TPS ratio)."""
    data = _paired_data(a, b, key, "tps" if metric == "tps" else "tau")
    if data is None:
        return None
    return _as_interval(*bootstrap(data, lambda s: 100.0 * (_tau_of(s, 0, 1) / _tau_of(s, 2, 3) - 1.0)))


def difference(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """Paired difference of τ, τ_A - τ_B."""
    data = _paired_data(a, b, key, "tau")
    if data is None:
        return None
    return _as_interval(*bootstrap(data, lambda s: _tau_of(s, 0, 1) - _tau_of(s, 2, 3)))


def state_reliance(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """τ with the run's own states minus τ with another prompt's states (the `state_swap` decode)."""
    if key == HELDOUT_TF:
        return None
    data = _paired_data(runs, runs, key, "tau", b_swapped=True)
    if data is None:
        return None
    return _as_interval(*bootstrap(data, lambda s: _tau_of(s, 0, 1) - _tau_of(s, 2, 3)))


def speedup(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """TPS over AR's TPS on the same prompts, paired prompt by prompt: mean over benchmarks of the
    row's TPS over the mean of AR's (as `ready.metrics.overall`). The AR timing is each prompt's
    `ar_wall_s`: on CUDA, AR decoded interleaved with the row in the same process (ABAB)."""
    names = _names(runs, key)
    if names is None or key == HELDOUT_TF:
        return None
    tables = [[_columns(_strata(r, key)[n], "speedup") for n in names] for r in runs]
    if any(not (t[:, 3] > 0).all() for per in tables for t in per):
        return None  # some prompt has no AR timing: no paired speedup
    return _as_interval(*bootstrap(tables, lambda x: _mean_strata(_ratio(x[..., 0], x[..., 1]))
                                   / _mean_strata(_ratio(x[..., 2], x[..., 3]))))


def survival(runs: Sequence[RunTallies], key: str) -> list[Optional[Interval]]:
    """Prefix survival P_j with its band for j = 1..K (None where no round observed j)."""
    names = _names(runs, key)
    if names is None or key == HELDOUT_TF:
        return []
    k = max(_strata(r, key)[n].hits.shape[1] for r in runs for n in names)
    if k == 0:
        return []
    data = [[_columns(_strata(r, key)[n], "survival", k) for n in names] for r in runs]

    def stat(s: np.ndarray) -> np.ndarray:  # [..., B, 2K] -> [..., K]
        p = _ratio(s[..., :k], s[..., k:])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(p, axis=-2)

    point, lo, hi = bootstrap(data, stat)
    return [_as_interval(point[j], lo[j], hi[j]) for j in range(k)]


# ---------------------------------------------------------------------------------------------
# MLflow metrics of one run, and of one run against a reference run of the same seed


def _keys(run: RunTallies) -> list[str]:
    return [*run.benchmarks, OVERALL] if run.benchmarks else []


def run_metrics(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """Interval metrics that need only this run's evaluation.json (docs/interfaces.md, "MLflow").

    `<b>/tau_lo|_hi`, `<b>/survival_<j>_lo|_hi`, `<b>/state_reliance[_lo|_hi]` (with a state_swap
    decode), `<b>/speedup_lo|_hi` (drafting rows, paired with the AR timing of each prompt) for
    every benchmark b and `overall`; `heldout_tf/tau[_lo|_hi]` (teacher-forced).
    An evaluation without per-prompt records gives no metrics.
    """
    run = tallies(evaluation)
    out: dict[str, float] = {}

    def put(name: str, iv: Optional[Interval], point: bool = False) -> None:
        if iv is not None:
            if point:
                out[name] = iv.value
            out[f"{name}_lo"], out[f"{name}_hi"] = iv.lo, iv.hi

    for key in _keys(run):
        put(f"{key}/tau", tau([run], key))
        for j, iv in enumerate(survival([run], key), start=1):
            put(f"{key}/survival_{j}", iv)
        put(f"{key}/state_reliance", state_reliance([run], key), point=True)
        if evaluation.get("method") not in (None, "ar"):
            put(f"{key}/speedup", speedup([run], key))
    put(f"{HELDOUT_TF}/tau", tau([run], HELDOUT_TF), point=True)
    return out


def gain_name(reference: str) -> str:
    """Metric stem of a gain against a reference: "" -> tau_gain_pct, "ft" -> tau_gain_vs_ft_pct."""
    return "tau_gain_pct" if not reference else f"tau_gain_vs_{reference}_pct"


def relative_metrics(evaluation: Mapping[str, Any], reference_evaluation: Mapping[str, Any],
                     name: str) -> dict[str, float]:
    """Paired τ gains of a run over a reference run of the same seed, with their intervals.

    `name` "" (DSpark) gives `<b>/tau_gain_pct[_lo|_hi]`; "ft" gives `<b>/tau_gain_vs_ft_pct[...]`,
    "placebo" `<b>/tau_gain_vs_placebo_pct[...]`; for every shared benchmark b, `overall` (when
    both ran the same benchmarks) and `heldout_tf` (teacher-forced, resampling sequences).
    """
    a, b = tallies(evaluation), tallies(reference_evaluation)
    stem = gain_name(name)
    out: dict[str, float] = {}
    keys = [k for k in a.benchmarks if k in b.benchmarks]
    if keys and sorted(a.benchmarks) == sorted(b.benchmarks):
        keys.append(OVERALL)
    keys.append(HELDOUT_TF)
    for key in keys:
        iv = gain_pct([a], [b], key)
        if iv is not None:
            out[f"{key}/{stem}"], out[f"{key}/{stem}_lo"], out[f"{key}/{stem}_hi"] = iv.value, iv.lo, iv.hi
    return out
