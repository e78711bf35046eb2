"""Paired resampling statistics of decoding logs: τ, gains, state reliance, survival, with intervals,
p-values and minimum detectable effects (docs/design.md, "How a table earns its numbers").

- **Units.** The unit of evidence is a (seed, prompt) pair. Every seed of a row decodes the same prompts,
  so seeds × prompts is a *crossed* design, and a comparison of row A with row B pairs A's (s, i) with
  B's (s, i). Sampled runs (eval.temperature > 0) pool a prompt's samples into its unit, and two runs
  pair only when every prompt has the same (sample, seed) set.
- **Pooling.** One definition everywhere: a quantity is a ratio of sums over every unit of every suite
  and seed it covers — τ = Σ committed / Σ rounds, TPS = Σ new tokens / Σ wall time, P_j = Σ hits_j /
  Σ observed_j. `overall` pools every suite's prompts this way (not a mean of the suites' values);
  `run_metrics` logs these pooled points to MLflow as `overall/tau|tps|survival_<j>`.
- **Resampling (crossed, Owen's "pigeonhole" bootstrap).** Each resample draws S of the S seeds and
  each suite's prompts with replacement, independently, and weighs unit (s, i) by (times s drawn) ×
  (times i drawn). It is conservative where unit-level noise dominates (it counts that noise up to
  three times) and, with few seeds, it shrinks the seed level by (S - 1)/S; the t below makes up for
  the latter (tests/test_stats.py checks coverage with 3 seeds where seeds, prompts or units dominate).
- **Intervals.** value ± t(df) × SE: SE is the resamples' standard deviation; df is Satterthwaite's for
  that variance, from the seed, prompt and residual mean squares of the statistic's linearised unit
  values (a two-way crossed ANOVA).
  With few seeds and a large seed variance df falls towards S - 1 (2 with 3 seeds: t = 4.30, not 1.96);
  with one seed the interval is conditional on that seed. The same (SE, df) give the p-value, the
  minimum detectable effect at 80 % power and the two one-sided tests of equivalence. Every statistic
  is a function of ratios of sums, so the weights' scale does not matter.
- **Thin comparisons.** A paired comparison in which fewer than MIN_DISCORDANT units differ between the
  two rows has no usable interval (its resamples are a few atoms); `Interval.thin` says so and
  `Interval.sign_p` is the sign test on those units.

Point estimates use all the data; the resampling seed is fixed, so the same runs give the same numbers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
from scipy import stats as sps

N_RESAMPLES = 4000  # >= 2,000 (docs/design.md)
SEED = 0  # resampling seed: the same runs always give the same interval
LEVEL = 0.95
ALPHA = 0.05  # 1 - LEVEL: the two-sided level of every test and mark
POWER = 0.80  # the power at which a minimum detectable effect is quoted
# fewer differing units: no interval, a count and a sign test (which needs >= 6 units to reach p < 0.05)
MIN_DISCORDANT = 10
OVERALL = "overall"  # every suite's prompts pooled (ratio of sums), resampled within each suite
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
    """A point estimate (on the full data) and its 95 % interval, with what it rests on.

    `se` and `df` give the interval (value ± t(df) × se), its p-value, its minimum detectable effect
    and its equivalence test; without `se` (an interval typed in by hand) the width stands for it.
    `discordant` and `ahead` are set for paired comparisons only.
    """

    value: float
    lo: float
    hi: float
    se: Optional[float] = None  # standard error (crossed bootstrap)
    df: float = math.inf  # t degrees of freedom (Satterthwaite, seeds and prompts)
    seeds: int = 0
    units: int = 0  # seed × prompt units behind the estimate
    discordant: Optional[int] = None  # paired: units on which the two rows decoded differently
    ahead: int = 0  # paired: of those, units on which the first row is ahead
    seed_share: Optional[float] = None  # share of the estimate's variance that sits at the seed level

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies wholly above or below 0 (an effect, not noise)."""
        return self.lo > 0 or self.hi < 0

    def clears(self, other: "Interval") -> bool:
        """True when this interval lies wholly above `other` (lower bound > other's upper bound)."""
        return self.lo > other.hi

    @property
    def std_error(self) -> float:
        if self.se is not None:
            return self.se
        return (self.hi - self.lo) / (2 * t_quantile(1 - ALPHA / 2, self.df))

    @property
    def thin(self) -> bool:
        """A paired comparison resting on fewer than MIN_DISCORDANT differing units: no interval to read."""
        return self.discordant is not None and self.discordant < MIN_DISCORDANT

    @property
    def p_value(self) -> float:
        """Two-sided p of "no difference" (t with `df`); the sign test's for a thin comparison."""
        if self.thin:
            return self.sign_p
        se = self.std_error
        if se <= 0:
            return 1.0 if self.value == 0 else 0.0
        return float(2 * sps.t.sf(abs(self.value) / se, self.df))

    @property
    def sign_p(self) -> float:
        """Two-sided sign test on the discordant units (1.0 when none differ)."""
        n = self.discordant or 0
        return float(sps.binomtest(self.ahead, n).pvalue) if n else 1.0

    def mde(self, power: float = POWER) -> float:
        """Smallest true effect this design detects with probability `power` (two-sided, level ALPHA):
        (t_{1-α/2} + t_power) × se, in the estimate's units."""
        return (t_quantile(1 - ALPHA / 2, self.df) + t_quantile(power, self.df)) * self.std_error

    def tost_p(self, margin: float) -> float:
        """p of the two one-sided tests that the true value lies inside (-margin, +margin) (equivalence)."""
        se = self.std_error
        if se <= 0:
            return 0.0 if abs(self.value) < margin else 1.0
        return float(max(sps.t.sf((self.value + margin) / se, self.df), sps.t.sf((margin - self.value) / se, self.df)))


def t_quantile(q: float, df: float) -> float:
    """Student-t quantile; the normal one for df = inf."""
    return float(sps.norm.ppf(q) if not math.isfinite(df) else sps.t.ppf(q, df))


def mean_interval(values: Sequence[float], level: float = 0.95) -> Optional[tuple[float, float, float]]:
    """(mean, lo, hi): the mean of independent values (paired differences, log ratios) with its Student-t
    interval; None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    half = t_quantile(0.5 + level / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the family, in the input order)."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p)
    adj = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(p)
    out[order] = adj
    return out.tolist()


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


def prompt_tallies(prompts: Sequence[Mapping[str, Any]], proposals: Optional[int] = None,
                   where: str = "prompts") -> Tallies:
    """Per-prompt committed tokens, rounds, survival hits/observed and timing from prompt records.

    c_i = sum(`committed`) when the record has it, else len(`tokens`) - 1 (tokens after the
    prefill token; `n_tokens` stands for len(`tokens`)); n_i = len(`accepted`). Survival over positions 1..K (K = `proposals`, else
    the largest horizon) counts only rounds whose horizon reached j (censoring, ready.metrics).
    """
    recs = list(prompts)
    acc = [_ints(r, "accepted", f"{where} prompt {r.get('index', i)}") for i, r in enumerate(recs)]
    hor = [_ints(r, "horizons", f"{where} prompt {r.get('index', i)}") for i, r in enumerate(recs)]
    for i, (a, h) in enumerate(zip(acc, hor)):
        if a.shape != h.shape:
            raise StatsError(f"{where} prompt {recs[i].get('index', i)}: {a.size} accepted values but "
                             f"{h.size} horizons; expected one of each per round")
    k = int(proposals) if proposals is not None else max((int(h.max()) for h in hor if h.size), default=0)
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
        k = (b.get("metrics") or {}).get("proposals")
        benches[name] = prompt_tallies(b["prompts"], k, where=f"benchmark {name!r}")
        swap = b.get("state_swap")
        if isinstance(swap, Mapping) and swap.get("prompts"):
            swapped[name] = prompt_tallies(swap["prompts"], k, where=f"benchmark {name!r} state_swap")
    tf = evaluation.get(HELDOUT_TF)
    held = sequence_tallies(tf) if isinstance(tf, Mapping) and tf.get("sequences") else None
    device = (evaluation.get("resolved") or {}).get("device")
    return RunTallies(benches, swapped, held, str(device) if device else None)


# ---------------------------------------------------------------------------------------------
# The crossed design: a (seed, unit) table, its resampling, its intervals


@dataclass(frozen=True)
class Design:
    """`x[s, u]`: unit u's column sums in seed s (unit u is the same prompt in every seed); units are
    grouped by suite, `strata[u]` the suite's number (prompts are resampled within their suite)."""

    x: np.ndarray  # [S, U, Q]
    strata: np.ndarray  # [U]

    @property
    def totals(self) -> np.ndarray:
        return self.x.sum((0, 1))


def pooled(sums: np.ndarray, num: int = 0, den: int = 1) -> np.ndarray:
    """The one pooling of every quantity here: Σ num / Σ den over the units (columns of [..., Q] sums);
    NaN where the denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = sums[..., den]
        return np.where(d > 0, sums[..., num] / np.where(d > 0, d, 1), np.nan)


def resampled_totals(d: Design, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[R, Q] column totals of crossed ("pigeonhole") bootstrap samples: the S seeds and every suite's P_b
    prompts drawn with replacement, independently; unit (s, u) weighed by (draws of s) × (draws of u).
    One seed is always drawn whole (the interval is then conditional on it)."""
    rng = np.random.default_rng(seed)
    n_seeds, _, q = d.x.shape
    w = rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=n_resamples)  # [R, S]
    out = np.zeros((n_resamples, q))
    for b in np.unique(d.strata):
        cols = np.flatnonzero(d.strata == b)
        v = rng.multinomial(cols.size, np.full(cols.size, 1 / cols.size), size=n_resamples)  # [R, P_b]
        for s in range(n_seeds):
            out += w[:, s, None] * (v @ d.x[s, cols])
    return out


def influence(d: Design, statistic: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """[S, U, O] each unit's linearised contribution to the statistic (its gradient at the totals, by
    central differences, times the unit's columns)."""
    t = d.totals.astype(float)
    f = lambda x: np.atleast_1d(statistic(x)).astype(float)  # noqa: E731
    jac = np.zeros((f(t).size, t.size))
    for q in range(t.size):
        h = 1e-6 * max(abs(t[q]), 1.0)
        up, down = t.copy(), t.copy()
        up[q] += h
        down[q] -= h
        jac[:, q] = (f(up) - f(down)) / (2 * h)
    return d.x @ np.nan_to_num(jac).T


def satterthwaite(z: np.ndarray, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(df, seed share) per output of unit values z [S, U, O] of a crossed seeds × prompts design.

    Two-way ANOVA without replication: mean squares of seeds (S - 1 df), prompts (centred within their
    suite, U - B df) and the residual ((S - 1)(U - B) df). The pigeonhole bootstrap's variance of the
    mean is about ((S - 1)/S MS_seed + MS_prompt + MS_resid) / (S U) (Owen 2007); its Satterthwaite df
    lies between min(S - 1, U - B) and their sum, near S - 1 when the seed level dominates. The seed
    share is the seed term's part of that sum."""
    n_seeds, n_units, n_out = z.shape
    prompt = z.mean(0)
    for b in np.unique(strata):
        prompt[strata == b] -= prompt[strata == b].mean(0)
    seed = z.mean(1) - z.mean((0, 1))
    resid = z - z.mean(0) - seed[:, None]  # prompt means removed with the suite means: the residual
    df_p, df_s = n_units - np.unique(strata).size, n_seeds - 1
    df_e = df_s * df_p
    zero = np.zeros(n_out)
    terms = [((n_seeds - 1) / n_seeds * n_units * (seed ** 2).sum(0) / df_s, df_s) if df_s > 0 else (zero, 1),
             (n_seeds * (prompt ** 2).sum(0) / df_p, df_p) if df_p > 0 else (zero, 1),
             ((resid ** 2).sum((0, 1)) / df_e, df_e) if df_e > 0 else (zero, 1)]
    total = sum(t for t, _ in terms)
    denom = sum(t ** 2 / k for t, k in terms)
    df = np.where(denom > 0, total ** 2 / np.where(denom > 0, denom, 1.0), math.inf)
    share = np.where(total > 0, terms[0][0] / np.where(total > 0, total, 1.0), 0.0)
    return df, share


def discordance(d: Design) -> tuple[int, int]:
    """(units where the rows differ, of those the units where the first row's ratio is higher) of a
    paired design with columns [num_A, den_A, num_B, den_B]."""
    a, b = d.x[..., :2], d.x[..., 2:4]
    differ = np.any(a != b, axis=-1)
    ahead = differ & (a[..., 0] * b[..., 1] > b[..., 0] * a[..., 1])
    return int(differ.sum()), int(ahead.sum())


def estimate(d: Design, statistic: Callable[[np.ndarray], np.ndarray], paired: bool = False,
             n_resamples: int = N_RESAMPLES, seed: int = SEED) -> list[Optional[Interval]]:
    """One Interval per output of `statistic` (totals [..., Q] -> [...] or [..., O]): the point on all
    the data, SE from the crossed bootstrap, value ± t(df) × SE with Satterthwaite's df. None where the
    point is not finite (a survival position no round observed)."""
    point = np.atleast_1d(statistic(d.totals)).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample that observed nothing at j: NaN
        res = np.asarray(statistic(resampled_totals(d, n_resamples, seed))).reshape(n_resamples, -1)
        se = np.nanstd(res, axis=0, ddof=1)
    df, share = satterthwaite(influence(d, statistic), d.strata)
    discordant, ahead = discordance(d) if paired else (None, 0)
    out: list[Optional[Interval]] = []
    for o, p in enumerate(point):
        if not (math.isfinite(p) and math.isfinite(se[o])):
            out.append(None)
            continue
        half = t_quantile(1 - ALPHA / 2, float(df[o])) * float(se[o])
        out.append(Interval(float(p), float(p - half), float(p + half), float(se[o]), float(df[o]),
                            d.x.shape[0], d.x.shape[0] * d.x.shape[1], discordant, ahead, float(share[o])))
    return out


# ---------------------------------------------------------------------------------------------
# Which units a key selects, and their columns


def _strata(run: RunTallies, key: str, swapped: bool = False) -> dict[str, Tallies]:
    source = run.swapped if swapped else run.benchmarks
    if key == HELDOUT_TF:
        return {} if swapped or run.heldout_tf is None else {HELDOUT_TF: run.heldout_tf}
    if key == OVERALL:
        return dict(source)
    return {key: source[key]} if key in source else {}


def _aligned(a: Tallies, b: Tallies, where: str, whose: str = "both rows (runs of one sweep setting)") -> Tallies:
    """`b` reordered to `a`'s units; StatsError when the two did not decode the same units (prompts,
    and for sampled runs the same (sample, seed) set of every prompt)."""
    if a.size == b.size and np.array_equal(a.index, b.index):
        out = b
    else:
        if a.size != b.size or set(a.index.tolist()) != set(b.index.tolist()):
            raise StatsError(f"{where}: the runs decoded different prompts ({a.size} vs {b.size}); expected the "
                             f"same prompts in {whose}")
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


def design(a: Sequence[RunTallies], key: str, what: str = "tau", b: Optional[Sequence[RunTallies]] = None,
           b_swapped: bool = False, k: int = 0) -> Optional[Design]:
    """The crossed table of `key` (a benchmark, OVERALL or HELDOUT_TF): row A's units per seed, and with
    `b` (seed s of B beside seed s of A) B's columns after A's; every seed's units in seed 0's order.
    None when a run lacks the key; StatsError when seeds or rows decoded different prompts."""
    if b is not None and len(a) != len(b):
        raise StatsError(f"{key}: {len(a)} runs of one row against {len(b)} of the other; expected one pair per seed")
    names = _names(a, key)
    if names is None or (b is not None and _names(b, key, b_swapped) != names):
        return None
    first = _strata(a[0], key)
    seeds = []
    for s, ra in enumerate(a):
        blocks = []
        for n in names:
            cols = _columns(_aligned(first[n], _strata(ra, key)[n], f"{n} (seed {s})", "every seed of a row"), what, k)
            if b is not None:
                tb = _aligned(first[n], _strata(b[s], key, b_swapped)[n], f"{n} (pair {s})")
                cols = np.concatenate([cols, _columns(tb, what, k)], axis=1)
            blocks.append(cols)
        seeds.append(np.concatenate(blocks))
    strata = np.concatenate([np.full(first[n].size, i) for i, n in enumerate(names)])
    return Design(np.stack(seeds).astype(float), strata)


def _one(d: Optional[Design], statistic: Callable[[np.ndarray], np.ndarray],
         paired: bool = False) -> Optional[Interval]:
    return None if d is None else estimate(d, statistic, paired)[0]


def _gain(t: np.ndarray) -> np.ndarray:
    return 100.0 * (pooled(t, 0, 1) / pooled(t, 2, 3) - 1.0)


def _difference(t: np.ndarray) -> np.ndarray:
    return pooled(t, 0, 1) - pooled(t, 2, 3)


# ---------------------------------------------------------------------------------------------
# Public statistics (runs: one RunTallies per seed; pairs: seed s of A with seed s of B)


def tau(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """A row's own τ, pooled over its prompts (every suite's, for OVERALL) and seeds."""
    return _one(design(runs, key, "tau"), pooled)


def point(runs: Sequence[RunTallies], key: str, what: str = "tau") -> Optional[float]:
    """A row's pooled τ ("tau") or TPS ("tps") over its seeds and prompts, without resampling."""
    d = None if (key == HELDOUT_TF and what != "tau") else design(runs, key, what)
    value = float(pooled(d.totals)) if d is not None else math.nan
    return value if math.isfinite(value) else None


def tps(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """A row's TPS, Σ new tokens / Σ wall time over its prompts and seeds."""
    return None if key == HELDOUT_TF else _one(design(runs, key, "tps"), pooled)


def gain_pct(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str, metric: str = "tau") -> Optional[Interval]:
    """Paired gain of row A over row B in percent, 100 (τ_A / τ_B - 1) (metric "tps": TPS ratio)."""
    return _one(design(a, key, "tps" if metric == "tps" else "tau", b), _gain, paired=True)


def difference(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """Paired difference of τ, τ_A - τ_B."""
    return _one(design(a, key, "tau", b), _difference, paired=True)


def state_reliance(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """τ with the run's own states minus τ with another prompt's states (the `state_swap` decode)."""
    if key == HELDOUT_TF:
        return None
    return _one(design(runs, key, "tau", runs, b_swapped=True), _difference, paired=True)


def speedup(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """TPS over AR's TPS on the same prompts, paired prompt by prompt (each prompt's `ar_wall_s`: on CUDA,
    AR decoded interleaved with the row in the same process, ABAB); pooled: Σ AR wall / Σ row wall."""
    d = None if key == HELDOUT_TF else design(runs, key, "speedup")
    if d is None or not (d.x[..., 3] > 0).all():
        return None  # some prompt has no AR timing: no paired speedup
    return _one(d, lambda x: pooled(x, 0, 1) / pooled(x, 2, 3))


def survival(runs: Sequence[RunTallies], key: str) -> list[Optional[Interval]]:
    """Prefix survival P_j = Σ hits_j / Σ observed_j with its band, j = 1..K (None where no round observed j)."""
    names = _names(runs, key)
    if names is None or key == HELDOUT_TF:
        return []
    k = max(_strata(r, key)[n].hits.shape[1] for r in runs for n in names)
    d = design(runs, key, "survival", k=k) if k else None
    if d is None:
        return []
    bands = estimate(d, lambda s: pooled(np.stack([s[..., :k], s[..., k:]], axis=-1)))
    return [None if iv is None else Interval(iv.value, max(iv.lo, 0.0), min(iv.hi, 1.0), iv.se, iv.df, iv.seeds,
                                             iv.units, seed_share=iv.seed_share) for iv in bands]


# ---------------------------------------------------------------------------------------------
# MLflow metrics of one run, and of one run against a reference run of the same seed


def _keys(run: RunTallies) -> list[str]:
    return [*run.benchmarks, OVERALL] if run.benchmarks else []


def run_metrics(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """Interval metrics that need only this run's evaluation.json (docs/interfaces.md, "MLflow").

    `<b>/tau_lo|_hi`, `<b>/survival_<j>_lo|_hi`, `<b>/state_reliance[_lo|_hi]` (with a state_swap
    decode), `<b>/speedup_lo|_hi` (drafting rows, paired with the AR timing of each prompt) for
    every benchmark b and `overall`; `heldout_tf/tau[_lo|_hi]` (teacher-forced). `overall/tau`,
    `overall/tps` and `overall/survival_<j>` are the pooled points (ratio of sums over every suite's
    prompts), which replace `ready.metrics.overall`'s means over suites in MLflow. One run: every
    interval is conditional on its seed. An evaluation without per-prompt records gives no metrics.
    """
    run = tallies(evaluation)
    out: dict[str, float] = {}

    def put(name: str, iv: Optional[Interval], point: bool = False, ends: bool = True) -> None:
        if iv is not None:
            if point:
                out[name] = iv.value
            if ends:
                out[f"{name}_lo"], out[f"{name}_hi"] = iv.lo, iv.hi

    for key in _keys(run):
        pool = key == OVERALL
        put(f"{key}/tau", tau([run], key), point=pool)
        for j, iv in enumerate(survival([run], key), start=1):
            put(f"{key}/survival_{j}", iv, point=pool)
        if pool:
            put(f"{key}/tps", tps([run], key), point=True, ends=False)
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
    "placebo" `<b>/tau_gain_vs_placebo_pct[...]`; for every shared benchmark b, `overall` (pooled, when
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
