"""Paired statistics of decoding logs: τ, gains, state reliance, survival and TPS, with 95 % intervals,
p-values and minimum detectable effects (docs/design.md, "How a table earns its numbers"; the method and
its formula: docs/sweeps.md, "How a table reads its intervals").

- **Units.** The unit of evidence is a (seed, prompt) pair. Every seed of a row decodes the same prompts,
  so seeds × prompts is a *crossed* design, and a comparison of row A with row B pairs A's (s, i) with
  B's (s, i). Sampled runs (eval.temperature > 0) pool a prompt's samples into its unit, and two runs
  pair only when every prompt has the same (sample, seed) set.
- **Pooling.** Every quantity is a function of sums over the units it covers (every suite's prompts for
  `overall`, every seed): τ = `ready.metrics.tau_of_counts` of the summed survival counts (1 + Σ_j
  Σ hits_j / Σ observed_j, the budget-censored rule of `ready.metrics`), TPS = Σ new tokens / Σ wall
  time, P_j = Σ hits_j / Σ observed_j; teacher-forced τ = Σ committed / Σ blocks (every block full).
- **Interval (closed form).** A statistic f of the column totals T = Σ_{s,i} x_si is linearised,
  f ≈ f(T) + Σ_{s,i} z_si with z_si = ∇f(T) · x_si, and its error split into two independent parts:
  the seed level (the S per-seed totals Z_s = Σ_i z_si differ by training and by each seed's own unit
  noise) and the prompt level (what every seed shares because the prompts are a sample):
      V_seed   = S Σ_s (Z_s - Z̄)² / (S - 1)                          (df S - 1)
      V_prompt = S U (MS_prompt - MS_resid)⁺, or U MS_prompt with one seed      (df U - B)
  with MS_prompt = S Σ_i (z̄_i - z̄_b(i))² / (U - B) (prompt means centred within their suite, B suites)
  and MS_resid the seed × prompt residual within suites, Σ (z_si - z̄_s,b - z̄_i + z̄_b)² / ((S-1)(U-B)).
  SE² = V_seed + V_prompt, and the 95 % interval is f(T) ± h, h² = t_{S-1}² V_seed + t_{U-B}² V_prompt
  (t at 0.975): each level with the t of its own degrees of freedom, added as Banerjee (1961) adds the
  two parts of a Behrens–Fisher problem, which keeps the coverage at or above 95 % whichever level
  carries the variance (tests/test_stats.py checks ≥ 94 % with 3 seeds in five regimes). `Interval.df`
  is the effective df, the t whose 0.975 quantile is h / SE; p-values, the MDE and the equivalence
  test use t(df) with that SE. One seed: no seed level, the interval is conditional on that seed.
  No resampling: the same runs give the same end points.
- **Thin comparisons.** A paired comparison in which fewer than MIN_DISCORDANT units differ between the
  two rows has no interval (the variance would rest on a handful of values while the t claims hundreds
  of df): its ends are ±inf, its p-value is the exact sign test on the differing units (`sign_p`), and
  it has no MDE or equivalence test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
from scipy import optimize, special
from scipy import stats as sps

from ready.metrics import tau_of_counts

LEVEL = 0.95
ALPHA = 0.05  # 1 - LEVEL: the two-sided level of every test and mark
POWER = 0.80  # the power at which a minimum detectable effect is quoted
# fewer differing units: no interval, a count and an exact sign test (which needs >= 6 units to reach p < 0.05);
# below ~30 the unit values that carry the variance are too few for the t's large df (t_29 vs normal: 4 %)
MIN_DISCORDANT = 30
OVERALL = "overall"  # every suite's prompts pooled (sums over units), prompts centred within each suite
HELDOUT_TF = "heldout_tf"  # teacher-forced acceptance on held-out regenerated sequences


class StatsError(ValueError):
    """An evaluation log cannot be read or paired; the message names the input."""


@dataclass(frozen=True)
class Tallies:
    """Per-unit sums of one benchmark of one run (a unit is a prompt, or a held-out sequence).

    τ of any set of units is `ready.metrics.tau_of_counts` of the summed hits and observed (teacher-forced:
    Σ committed / Σ rounds); survival P_j = Σ hits[:, j-1] / Σ observed[:, j-1]; TPS = Σ new_tokens /
    Σ wall_s. `index` pairs units across runs.
    """

    index: np.ndarray  # [P] int
    rounds: np.ndarray  # [P] verification rounds (teacher-forced: blocks)
    hits: np.ndarray  # [P, K] rounds with A >= j among those that observed position j
    observed: np.ndarray  # [P, K] rounds with horizon >= j
    new_tokens: np.ndarray  # [P] generated tokens (prefill token included), for TPS
    wall_s: np.ndarray  # [P] decode wall time, for TPS
    ar_wall_s: Optional[np.ndarray] = None  # [P] AR's wall time on the same prompt, for the speedup
    # sampled runs: per unit, the sorted (sample, seed) pairs pooled into it (None: one greedy decode per prompt)
    samples: Optional[tuple] = None
    committed: Optional[np.ndarray] = None  # [P] teacher-forced only: tokens its blocks commit (τ = Σ / Σ rounds)

    @property
    def size(self) -> int:
        return int(self.index.shape[0])


@dataclass(frozen=True)
class RunTallies:
    """Everything the statistics need from one run's evaluation.json."""

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

    `se` and `df` (the effective df, module docstring) give the p-value, the minimum detectable effect
    and the equivalence test; without `se` (an interval typed in by hand) the width stands for it.
    `discordant` and `ahead` are set for paired comparisons only; a thin one has ends ±inf.
    """

    value: float
    lo: float
    hi: float
    se: Optional[float] = None  # standard error, √(V_seed + V_prompt)
    df: float = math.inf  # effective t degrees of freedom: t_df(0.975) × se is the half-width
    seeds: int = 0
    units: int = 0  # seed × prompt units behind the estimate
    discordant: Optional[int] = None  # paired: units on which the two rows decoded differently
    ahead: int = 0  # paired: of those, units on which the first row is ahead
    seed_share: Optional[float] = None  # V_seed / (V_seed + V_prompt)

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
        """Two-sided p of "no difference" (t with `df`); the exact sign test's for a thin comparison."""
        if self.thin:
            return self.sign_p
        se = self.std_error
        if se <= 0:
            return 1.0 if self.value == 0 else 0.0
        return float(2 * sps.t.sf(abs(self.value) / se, self.df))

    @property
    def sign_p(self) -> float:
        """Two-sided exact sign test on the discordant units (1.0 when none differ)."""
        n = self.discordant or 0
        return float(sps.binomtest(self.ahead, n).pvalue) if n else 1.0

    def _not_thin(self, what: str) -> None:
        if self.thin:
            raise ValueError(f"a thin comparison ({self.discordant} of {self.units} units differ) has no {what}; "
                             "read its sign test (Interval.sign_p)")

    def mde(self, power: float = POWER) -> float:
        """Smallest true effect this design detects with probability `power` (two-sided, level ALPHA):
        (t_{1-α/2} + t_power) × se, in the estimate's units. ValueError for a thin comparison."""
        self._not_thin("minimum detectable effect")
        return (t_quantile(1 - ALPHA / 2, self.df) + t_quantile(power, self.df)) * self.std_error

    def tost_p(self, margin: float) -> float:
        """p of the two one-sided tests that the true value lies inside (-margin, +margin) (equivalence).
        ValueError for a thin comparison."""
        self._not_thin("equivalence test")
        se = self.std_error
        if se <= 0:
            return 0.0 if abs(self.value) < margin else 1.0
        return float(max(sps.t.sf((self.value + margin) / se, self.df), sps.t.sf((margin - self.value) / se, self.df)))


def t_quantile(q: float, df: float) -> float:
    """Student-t quantile; the normal one for df = inf."""
    return float(special.ndtri(q) if not math.isfinite(df) else special.stdtrit(df, q))


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
    """Per-prompt rounds, survival hits/observed and timing from prompt records.

    Rounds = len(`accepted`); over positions 1..K (K = `proposals`, else the largest horizon) hits_j counts
    the rounds with A >= j among the observed_j rounds whose horizon reached j (censoring, ready.metrics);
    new tokens = len(`tokens`) (`n_tokens` in a record slimmed of its token ids). τ reads hits and observed
    only, so a record's `committed` list is not read.
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
    hits, observed = np.zeros((len(recs), k)), np.zeros((len(recs), k))
    for i in range(len(recs)):
        seen = hor[i][:, None] >= js
        hits[i] = (seen & (acc[i][:, None] >= js)).sum(0)
        observed[i] = seen.sum(0)
    per_record = Tallies(
        index=np.asarray([int(r.get("index", i)) for i, r in enumerate(recs)], dtype=np.int64),
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

    return Tallies(index=np.asarray(list(groups), dtype=np.int64), rounds=pool(t.rounds), hits=pool(t.hits),
                   observed=pool(t.observed), new_tokens=pool(t.new_tokens), wall_s=pool(t.wall_s),
                   ar_wall_s=None if t.ar_wall_s is None else pool(t.ar_wall_s), samples=tuple(sig),
                   committed=None if t.committed is None else pool(t.committed))


def sequence_tallies(heldout: Mapping[str, Any], where: str = HELDOUT_TF) -> Tallies:
    """Teacher-forced tallies: committed tokens and blocks per held-out sequence (every block is a full
    block at an anchor of the sequence, so nothing is cut and τ = Σ committed / Σ blocks)."""
    seqs = heldout.get("sequences")
    if not isinstance(seqs, Mapping) or "committed" not in seqs or "blocks" not in seqs:
        raise StatsError(f"{where}: expected 'sequences' with lists 'committed' and 'blocks'")
    c = np.asarray(seqs["committed"], dtype=float).reshape(-1)
    n = np.asarray(seqs["blocks"], dtype=float).reshape(-1)
    if c.shape != n.shape:
        raise StatsError(f"{where}: {c.size} 'committed' values but {n.size} 'blocks'; expected one each per sequence")
    p = c.size
    return Tallies(index=np.arange(p), rounds=n, hits=np.zeros((p, 0)), observed=np.zeros((p, 0)),
                   new_tokens=np.zeros(p), wall_s=np.zeros(p), committed=c)


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
# The crossed design: a (seed, unit) table and its closed-form interval


@dataclass(frozen=True)
class Design:
    """`x[s, u]`: unit u's column sums in seed s (unit u is the same prompt in every seed); units are
    grouped by suite, `strata[u]` the suite's number (the prompt level is centred within each suite).
    `widths`: how many of the Q columns belong to each row, A's first (a paired design has two)."""

    x: np.ndarray  # [S, U, Q]
    strata: np.ndarray  # [U]
    widths: tuple[int, ...] = ()

    @property
    def totals(self) -> np.ndarray:
        return self.x.sum((0, 1))


def influence(d: Design, statistic: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """[S, U, O] each unit's linearised contribution to the statistic: its gradient at the totals (central
    differences) times the unit's columns, so that f(T) - f(T₀) ≈ Σ_{s,u} z_su."""
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


def levels(z: np.ndarray, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(V_seed [O], V_prompt [O], df_seed, df_prompt): the two variance parts of Σ z over a crossed seeds ×
    prompts table of unit values z [S, U, O] (the module docstring's formula; df 0 marks an absent part)."""
    n_seeds, n_units, n_out = z.shape
    suites = np.unique(strata)
    df_s, df_p = n_seeds - 1, n_units - suites.size
    v_seed = np.zeros(n_out)
    if df_s > 0:
        totals = z.sum(1)  # [S, O]: each seed's Σ_u z
        v_seed = n_seeds * ((totals - totals.mean(0)) ** 2).sum(0) / df_s
    if df_p <= 0:
        return v_seed, np.zeros(n_out), df_s, 0
    unit = z.mean(0)  # [U, O]: each prompt's mean over seeds
    resid = z.copy()
    for b in suites:
        m = strata == b
        unit[m] -= unit[m].mean(0)  # prompt effects within the suite
        resid[:, m] -= z[:, m].mean(1, keepdims=True)  # each seed's suite mean removed ...
    resid -= unit[None]  # ... and each prompt's effect: the seed × prompt residual within suites
    ms_prompt = n_seeds * (unit ** 2).sum(0) / df_p
    if df_s == 0:  # one seed: the prompt level is all there is (the interval is conditional on the seed)
        return v_seed, n_units * ms_prompt, 0, df_p
    ms_resid = (resid ** 2).sum((0, 1)) / (df_s * df_p)
    return v_seed, n_seeds * n_units * np.maximum(ms_prompt - ms_resid, 0.0), df_s, df_p


def _effective_df(half: float, se: float, dfs: Sequence[int]) -> float:
    """The df whose t quantile at 1 - ALPHA/2 is half / se (between the smallest and the largest part's df)."""
    target = half / se
    lo, hi = min(dfs), max(dfs)
    if lo == hi or target >= t_quantile(1 - ALPHA / 2, lo):
        return float(lo)
    if target <= t_quantile(1 - ALPHA / 2, hi):
        return float(hi)
    g = lambda x: t_quantile(1 - ALPHA / 2, math.exp(x)) - target  # noqa: E731
    return float(math.exp(optimize.brentq(g, math.log(lo), math.log(hi), xtol=1e-10)))


def _spread(v_seed: float, v_prompt: float, df_s: int, df_p: int) -> tuple[float, float, float]:
    """(SE, half-width, effective df) from the two parts (the module docstring's formula)."""
    dfs = [k for k in (df_s, df_p) if k > 0]
    se = math.sqrt(v_seed + v_prompt)
    half = math.sqrt(sum(t_quantile(1 - ALPHA / 2, k) ** 2 * v for v, k in ((v_seed, df_s), (v_prompt, df_p)) if k > 0))
    return se, half, (_effective_df(half, se, dfs) if se > 0 else float(max(dfs)))


def planned_mde(sd_unit: float, seeds: int, prompts: int, sd_seed: float = 0.0, sd_prompt: float = 0.0,
                suites: int = 1, power: float = POWER) -> float:
    """The MDE a design of `seeds` × `prompts` (a seed, in `suites` suites) is expected to have, in the units
    of the SDs: a comparison whose unit values are a_s + b_i + e_si with SDs `sd_seed`, `sd_prompt`,
    `sd_unit`, read by this module's interval (the parts at their expected values)."""
    per = seeds * prompts
    v_seed = (sd_seed ** 2 / seeds + sd_unit ** 2 / per) if seeds > 1 else 0.0
    v_prompt = sd_prompt ** 2 / prompts + (sd_unit ** 2 / per if seeds == 1 else 0.0)
    se, half, df = _spread(v_seed, v_prompt, seeds - 1, prompts - suites)
    return Interval(0.0, -half, half, se, df).mde(power)


def discordance(d: Design, row: Callable[[np.ndarray], np.ndarray]) -> tuple[int, int]:
    """(units where the two rows' columns differ, of those the units where the first row's value `row` is
    higher) of a paired design."""
    qa = d.widths[0]
    a, b = d.x[..., :qa], d.x[..., qa:]
    differ = np.any(a != b, axis=-1) if a.shape == b.shape else np.ones(d.x.shape[:2], dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        ahead = differ & (np.nan_to_num(row(a), nan=-np.inf) > np.nan_to_num(row(b), nan=-np.inf))
    return int(differ.sum()), int(ahead.sum())


def estimate(d: Design, statistic: Callable[[np.ndarray], np.ndarray], paired: bool = False,
             row: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> list[Optional[Interval]]:
    """One Interval per output of `statistic` (totals [..., Q] -> [...] or [..., O]): the point on all the
    data and the closed-form interval of the module docstring. `paired`: a comparison of two rows, whose
    discordant units are counted (`row`: one row's value from its columns, for the units ahead). None
    where the point is not finite (a survival position no round observed); ends ±inf where no level can be
    estimated (one seed, one prompt per suite)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        point = np.atleast_1d(statistic(d.totals)).astype(float)
    v_seed, v_prompt, df_s, df_p = levels(influence(d, statistic), d.strata)
    discordant, ahead = discordance(d, row or statistic) if paired else (None, 0)
    thin = discordant is not None and discordant < MIN_DISCORDANT
    n_seeds, units = d.x.shape[0], d.x.shape[0] * d.x.shape[1]
    out: list[Optional[Interval]] = []
    for o, p in enumerate(point):
        if not math.isfinite(p):
            out.append(None)
            continue
        if df_s <= 0 and df_p <= 0:  # one seed and one prompt per suite: a point, no level to estimate a spread from
            out.append(Interval(float(p), -math.inf, math.inf, math.nan, math.nan, n_seeds, units, discordant, ahead))
            continue
        vs, vp = float(v_seed[o]), float(v_prompt[o])
        se, half, df = _spread(vs, vp, df_s, df_p)
        lo, hi = (-math.inf, math.inf) if thin else (p - half, p + half)
        out.append(Interval(float(p), lo, hi, se, df, n_seeds, units, discordant, ahead, vs / (vs + vp) if vs + vp > 0 else 0.0))
    return out


# ---------------------------------------------------------------------------------------------
# Which units a key selects, their columns, and the value of one row from its columns


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
        pick = lambda x: None if x is None else x[order]  # noqa: E731
        out = Tallies(a.index, b.rounds[order], b.hits[order], b.observed[order], b.new_tokens[order],
                      b.wall_s[order], pick(b.ar_wall_s), None if b.samples is None else tuple(b.samples[k] for k in order),
                      pick(b.committed))
    if a.samples != out.samples:
        raise StatsError(f"{where}: the runs decoded different samples of their prompts (one greedy, or other "
                         "samples or seeds); expected the same eval.temperature, eval.samples_per_prompt and "
                         "eval.sample_seed in both rows")
    return out


def _columns(t: Tallies, what: str, k: int) -> np.ndarray:
    """A unit's columns for `what`: "tau" hits_1..K then observed_1..K (teacher-forced: committed, blocks),
    "survival" the same, "tps" new tokens and wall time, "speedup" those and AR's wall time; `k` pads K."""
    if what == "tps":
        return np.stack([t.new_tokens, t.wall_s], axis=1)
    if what == "speedup":  # the row's and AR's TPS on the same prompts (the same tokens: lossless)
        ar = t.ar_wall_s if t.ar_wall_s is not None else np.zeros_like(t.wall_s)
        return np.stack([t.new_tokens, t.wall_s, t.new_tokens, ar], axis=1)
    if t.committed is not None:  # teacher-forced
        return np.stack([t.committed, t.rounds], axis=1)
    pad = ((0, 0), (0, k - t.hits.shape[1]))
    return np.concatenate([np.pad(t.hits, pad), np.pad(t.observed, pad)], axis=1)


def pooled(c: np.ndarray, num: int = 0, den: int = 1) -> np.ndarray:
    """Σ num / Σ den of columns [..., Q]; NaN where the denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = c[..., den]
        return np.where(d > 0, c[..., num] / np.where(d > 0, d, 1), np.nan)


def value_of(what: str, teacher_forced: bool = False) -> Callable[[np.ndarray], np.ndarray]:
    """One row's quantity from its column sums [..., Q] (`_columns`): τ (ready.metrics.tau_of_counts, or
    Σ committed / Σ blocks teacher-forced), TPS, the speedup, or the survival vector P_1..P_K."""
    if what == "tps" or (what == "tau" and teacher_forced):
        return pooled
    if what == "speedup":
        return lambda c: pooled(c, 0, 1) / pooled(c, 2, 3)
    if what == "survival":
        def survival_of(c: np.ndarray) -> np.ndarray:
            k = c.shape[-1] // 2
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(c[..., k:] > 0, c[..., :k] / np.where(c[..., k:] > 0, c[..., k:], 1), np.nan)
        return survival_of
    return lambda c: tau_of_counts(c[..., : c.shape[-1] // 2], c[..., c.shape[-1] // 2:])


def _names(runs: Sequence[RunTallies], key: str, swapped: bool = False) -> Optional[list[str]]:
    """Stratum names shared by every run, or None when a run lacks them (nothing to compute)."""
    sets = [list(_strata(r, key, swapped)) for r in runs]
    if not runs or not sets[0] or any(sorted(s) != sorted(sets[0]) for s in sets):
        return None
    return sorted(sets[0])


def _width(runs: Sequence[RunTallies], key: str, names: Sequence[str], swapped: bool = False) -> int:
    """K of a row: the most draft positions any of its runs' strata counts."""
    return max(_strata(r, key, swapped)[n].hits.shape[1] for r in runs for n in names)


def design(a: Sequence[RunTallies], key: str, what: str = "tau", b: Optional[Sequence[RunTallies]] = None,
           b_swapped: bool = False) -> Optional[Design]:
    """The crossed table of `key` (a benchmark, OVERALL or HELDOUT_TF): row A's units per seed, and with
    `b` (seed s of B beside seed s of A) B's columns after A's; every seed's units in seed 0's order.
    None when a run lacks the key; StatsError when seeds or rows decoded different prompts."""
    if b is not None and len(a) != len(b):
        raise StatsError(f"{key}: {len(a)} runs of one row against {len(b)} of the other; expected one pair per seed")
    names = _names(a, key)
    if names is None or (b is not None and _names(b, key, b_swapped) != names):
        return None
    ka = _width(a, key, names)
    kb = _width(b, key, names, b_swapped) if b is not None else 0
    first = _strata(a[0], key)
    seeds, widths = [], ()
    for s, ra in enumerate(a):
        blocks = []
        for n in names:
            cols = _columns(_aligned(first[n], _strata(ra, key)[n], f"{n} (seed {s})", "every seed of a row"), what, ka)
            widths = (cols.shape[1],)
            if b is not None:
                other = _columns(_aligned(first[n], _strata(b[s], key, b_swapped)[n], f"{n} (pair {s})"), what, kb)
                widths = (cols.shape[1], other.shape[1])
                cols = np.concatenate([cols, other], axis=1)
            blocks.append(cols)
        seeds.append(np.concatenate(blocks))
    strata = np.concatenate([np.full(first[n].size, i) for i, n in enumerate(names)])
    return Design(np.stack(seeds).astype(float), strata, widths)


def _one(d: Optional[Design], what: str, key: str, compare: Optional[str] = None) -> Optional[Interval]:
    """The interval of one row's `what` (compare None), or of A against B: "gain" 100 (A/B - 1) or
    "difference" A - B."""
    if d is None:
        return None
    f = value_of(what, key == HELDOUT_TF)
    if compare is None:
        return estimate(d, f)[0]
    qa = d.widths[0]
    if compare == "gain":
        stat = lambda t: 100.0 * (f(t[..., :qa]) / f(t[..., qa:]) - 1.0)  # noqa: E731
    else:
        stat = lambda t: f(t[..., :qa]) - f(t[..., qa:])  # noqa: E731
    return estimate(d, stat, paired=True, row=f)[0]


# ---------------------------------------------------------------------------------------------
# Public statistics (runs: one RunTallies per seed; pairs: seed s of A with seed s of B)


def tau(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """A row's own τ, pooled over its prompts (every suite's, for OVERALL) and seeds."""
    return _one(design(runs, key, "tau"), "tau", key)


def point(runs: Sequence[RunTallies], key: str, what: str = "tau") -> Optional[float]:
    """A row's pooled τ ("tau") or TPS ("tps") over its seeds and prompts, without an interval."""
    d = None if (key == HELDOUT_TF and what != "tau") else design(runs, key, what)
    if d is None:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(value_of(what, key == HELDOUT_TF)(d.totals))
    return value if math.isfinite(value) else None


def tps(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """A row's TPS, Σ new tokens / Σ wall time over its prompts and seeds."""
    return None if key == HELDOUT_TF else _one(design(runs, key, "tps"), "tps", key)


def gain_pct(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str, metric: str = "tau") -> Optional[Interval]:
    """Paired gain of row A over row B in percent, 100 (τ_A / τ_B - 1) (metric "tps": TPS ratio)."""
    what = "tps" if metric == "tps" else "tau"
    if what == "tps" and key == HELDOUT_TF:
        return None
    return _one(design(a, key, what, b), what, key, "gain")


def difference(a: Sequence[RunTallies], b: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """Paired difference of τ, τ_A - τ_B."""
    return _one(design(a, key, "tau", b), "tau", key, "difference")


def state_reliance(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """τ with the run's own states minus τ with another prompt's states (the `state_swap` decode)."""
    if key == HELDOUT_TF:
        return None
    return _one(design(runs, key, "tau", runs, b_swapped=True), "tau", key, "difference")


def speedup(runs: Sequence[RunTallies], key: str) -> Optional[Interval]:
    """TPS over AR's TPS on the same prompts, paired prompt by prompt (each prompt's `ar_wall_s`: on CUDA,
    AR decoded interleaved with the row in the same process, ABAB); pooled: Σ AR wall / Σ row wall."""
    d = None if key == HELDOUT_TF else design(runs, key, "speedup")
    if d is None or not (d.x[..., 3] > 0).all():
        return None  # some prompt has no AR timing: no paired speedup
    return _one(d, "speedup", key)


def survival(runs: Sequence[RunTallies], key: str) -> list[Optional[Interval]]:
    """Prefix survival P_j = Σ hits_j / Σ observed_j with its band, j = 1..K (None where no round observed j)."""
    if key == HELDOUT_TF:
        return []
    d = design(runs, key, "survival")
    if d is None or d.x.shape[-1] == 0:
        return []
    bands = estimate(d, value_of("survival"))
    return [None if iv is None else Interval(iv.value, max(iv.lo, 0.0), min(iv.hi, 1.0), iv.se, iv.df, iv.seeds,
                                             iv.units, seed_share=iv.seed_share) for iv in bands]


# ---------------------------------------------------------------------------------------------
# MLflow metrics of one run, and of one run against a reference run of the same seed


def _keys(run: RunTallies) -> list[str]:
    return [*run.benchmarks, OVERALL] if run.benchmarks else []


def run_metrics(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """Interval metrics that need only this run's evaluation.json (docs/interfaces.md, "MLflow").

    `<b>/tau_lo|_hi`, `<b>/survival_<j>_lo|_hi`, `<b>/state_reliance[_lo|_hi]` (with a
    state_swap decode), `<b>/speedup_lo|_hi` (drafting rows, paired with the AR timing of each prompt) for
    every benchmark b and `overall`; `heldout_tf/tau[_lo|_hi]` (teacher-forced). The points `<b>/tau`,
    `<b>/tps`, `<b>/survival_<j>` (`overall` too) are logged from `ready.metrics`, which pools the same way. One run:
    every interval is conditional on its seed. A thin state reliance logs its point only. An evaluation
    without per-prompt records gives no metrics.
    """
    run = tallies(evaluation)
    out: dict[str, float] = {}

    def put(name: str, iv: Optional[Interval], point: bool = False) -> None:
        if iv is None:
            return
        if point:
            out[name] = iv.value
        if math.isfinite(iv.lo) and math.isfinite(iv.hi):
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
    "placebo" `<b>/tau_gain_vs_placebo_pct[...]`; for every shared benchmark b, `overall` (pooled, when
    both ran the same benchmarks) and `heldout_tf` (teacher-forced, over sequences). A thin comparison
    (fewer than MIN_DISCORDANT differing prompts) logs its point only.
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
            out[f"{key}/{stem}"] = iv.value
            if not iv.thin:
                out[f"{key}/{stem}_lo"], out[f"{key}/{stem}_hi"] = iv.lo, iv.hi
    return out
