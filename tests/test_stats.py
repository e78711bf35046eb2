"""ready.stats on hand-built evaluation logs: the paired interval agrees with scipy's paired
bootstrap (one seed) and with a plain loop (seeds, then prompts); a 1 % τ gain over ~500 rounds
is noise, a 10 % one is not; point estimates are the metrics the evaluation reports."""

import numpy as np
import pytest

from evaluation_logs import K, bench_rounds, evaluation, record
from ready import stats
from ready.metrics import SequenceLog, overall, summarize


def _row(seed, gain=0.0, ref=None, prompts=10, rounds=50, **kw):
    rows = {b: bench_rounds(seed + 7 * i, prompts, rounds, gain, ref[b] if ref else None)
            for i, b in enumerate(("humaneval", "gsm8k"))}
    return rows, stats.tallies(evaluation("ready", rows, **kw))


def _sums(run, bench):
    t = run.benchmarks[bench]
    return t.committed, t.rounds


def test_one_seed_gain_interval_matches_scipy_paired_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    ref_rounds, ref = _row(1)
    _, row = _row(2, 0.05, ref_rounds)
    c_a, n_a = _sums(row, "humaneval")
    c_b, n_b = _sums(ref, "humaneval")

    def gain(ca, na, cb, nb, axis=-1):
        return 100 * ((ca.sum(axis) / na.sum(axis)) / (cb.sum(axis) / nb.sum(axis)) - 1)

    theirs = scipy_stats.bootstrap((c_a, n_a, c_b, n_b), gain, paired=True, vectorized=True, n_resamples=4000,
                                   method="percentile", confidence_level=0.95, rng=np.random.default_rng(7))
    ours = stats.gain_pct([row], [ref], "humaneval")
    assert ours.value == pytest.approx(gain(c_a, n_a, c_b, n_b))
    width = ours.hi - ours.lo
    # two Monte Carlo estimates of the same percentiles: equal to well under a tenth of the width
    assert ours.lo == pytest.approx(theirs.confidence_interval.low, abs=0.1 * width)
    assert ours.hi == pytest.approx(theirs.confidence_interval.high, abs=0.1 * width)


def test_crossed_bootstrap_matches_a_plain_loop_over_seeds_and_prompts():
    """Each resample draws the S seeds and each suite's prompts with replacement, independently (one prompt
    draw for every seed), and weighs unit (s, i) by the product of their draws; the interval is
    value ± t(df) × SE."""
    seeds = [(_row(10 + s), _row(20 + s)) for s in range(3)]
    refs = [r for (_, r), _ in seeds]
    rows = [r for _, (_, r) in seeds]
    ours = stats.gain_pct(rows, refs, "overall")

    rng = np.random.default_rng(99)
    benches = ("gsm8k", "humaneval")
    draws = []
    for _ in range(2000):
        tot = np.zeros(4)
        idx = {b: rng.integers(0, 10, size=10) for b in benches}  # the same prompts, whichever seed
        for _slot in range(3):
            s = rng.integers(3)
            for b in benches:
                ca, na = _sums(rows[s], b)
                cb, nb = _sums(refs[s], b)
                tot += [ca[idx[b]].sum(), na[idx[b]].sum(), cb[idx[b]].sum(), nb[idx[b]].sum()]
        draws.append(100 * (tot[0] / tot[1] / (tot[2] / tot[3]) - 1))
    assert ours.se == pytest.approx(np.std(draws, ddof=1), rel=0.08)
    assert ours.seeds == 3 and ours.units == 3 * 20
    t = scipy_t_quantile(ours.df)
    assert (ours.lo, ours.hi) == pytest.approx((ours.value - t * ours.se, ours.value + t * ours.se))
    # the point pools every suite's prompts of every seed: one ratio of sums, not a mean over suites
    tot = [sum(_sums(r, b)[i].sum() for r in rs for b in benches) for rs in (rows, refs) for i in (0, 1)]
    assert ours.value == pytest.approx(100 * (tot[0] / tot[1] / (tot[2] / tot[3]) - 1))


def scipy_t_quantile(df):
    return pytest.importorskip("scipy.stats").t.ppf(0.975, df)


def _crossed(effects=None, **kw):
    from evaluation_logs import crossed_pair

    refs, rows = crossed_pair(**kw, effects=effects)
    return stats.gain_pct([stats.tallies(e) for e in rows], [stats.tallies(e) for e in refs], "b")


def test_the_standard_error_matches_the_known_variance_components():
    """Hand-built logs with gains 1 + a_s + b_i + e_si: the bootstrap variance is the pigeonhole's of the
    realised components (Owen 2007): s_a² / S + s_b² / P + 3 s_e² / (S P), each spread taken over the
    S seeds or P prompts as drawn (divisor S or P), the unit-level noise counted three times."""
    for sd_seed, sd_prompt, sd_unit in ((0.03, 0.0, 0.02), (0.0, 0.05, 0.02), (0.02, 0.03, 0.03)):
        eff = {}
        iv = _crossed(eff, n_seeds=8, n_prompts=40, n_rounds=40, sd_seed=sd_seed, sd_prompt=sd_prompt,
                      sd_unit=sd_unit, seed=1)
        a, b, e = eff["a"], eff["b"], eff["e"]
        e = e - e.mean(0) - e.mean(1, keepdims=True) + e.mean()
        want = 100 * np.sqrt(a.var() / 8 + b.var() / 40 + 3 * (e ** 2).mean() / (8 * 40))
        assert iv.se == pytest.approx(want, rel=0.2), (sd_seed, sd_prompt, sd_unit)
        # the seed share is the seed term's part of the pigeonhole variance, (S - 1)/S MS_seed of
        # (S - 1)/S MS_seed + MS_prompt + MS_resid (E MS_seed = P σ_a² + σ_e², E MS_prompt = S σ_b² + σ_e²)
        ms_s, ms_p, ms_e = 40 * a.var(ddof=1) + (e ** 2).mean(), 8 * b.var(ddof=1) + (e ** 2).mean(), (e ** 2).mean()
        assert iv.seed_share == pytest.approx(7 / 8 * ms_s / (7 / 8 * ms_s + ms_p + ms_e), abs=0.1)


def test_with_few_seeds_and_a_seed_effect_the_interval_is_a_t_on_about_s_minus_1_df():
    seedy = _crossed(n_seeds=3, n_prompts=64, n_rounds=20, sd_seed=0.04, sd_unit=0.01, seed=2)
    assert 2 <= seedy.df < 4 and seedy.seed_share > 0.8
    assert (seedy.hi - seedy.lo) / (2 * seedy.se) > 3.0  # t(2..4): 2.8 .. 4.3, not the normal 1.96
    prompty = _crossed(n_seeds=3, n_prompts=64, n_rounds=20, sd_prompt=0.04, sd_unit=0.01, seed=2)
    assert prompty.df > 60 and prompty.seed_share < 0.1
    assert (prompty.hi - prompty.lo) / (2 * prompty.se) == pytest.approx(2.0, abs=0.03)


@pytest.mark.parametrize("sd_seed, sd_prompt, sd_unit", [(0.04, 0.0, 0.01), (0.0, 0.05, 0.02), (0.0, 0.0, 0.06)])
def test_the_crossed_interval_keeps_its_coverage_with_three_seeds(sd_seed, sd_prompt, sd_unit):
    """Over 150 designs of 3 seeds × 48 prompts (no true gain), the 95 % interval covers 0 at least ~95 %
    of the time whether seeds, prompts or single units carry the variance; where seeds do, a normal
    interval on the same SE (the old reading) does not."""
    rng = np.random.default_rng(5)
    hit = hit_normal = 0
    for _ in range(150):
        x = np.zeros((3, 48, 4))
        gains = (rng.normal(0, sd_seed, 3)[:, None] + rng.normal(0, sd_prompt, 48)[None]
                 + rng.normal(0, sd_unit, (3, 48)))
        x[..., 1] = x[..., 3] = 20.0
        x[..., 2] = 50.0
        x[..., 0] = 50.0 * (1 + gains)
        iv = stats.estimate(stats.Design(x, np.zeros(48, dtype=int)), stats._gain, n_resamples=800)[0]
        hit += iv.lo <= 0 <= iv.hi
        hit_normal += abs(iv.value) <= 1.96 * iv.se
    assert hit / 150 >= 0.9
    if sd_seed:
        assert hit_normal / 150 < 0.85


def test_seeds_widen_the_interval_when_training_varies_between_them():
    """Three seeds that disagree (gains +0 %, +6 %, +12 %) give a wider interval than one seed alone."""
    ref_rounds = [_row(30 + s, prompts=20, rounds=100)[0] for s in range(3)]
    refs = [stats.tallies(evaluation("dspark", r)) for r in ref_rounds]
    rows = [_row(40 + s, g, ref_rounds[s], prompts=20, rounds=100)[1] for s, g in enumerate((0.0, 0.06, 0.12))]
    many = stats.gain_pct(rows, refs, "overall")
    one = stats.gain_pct(rows[1:2], refs[1:2], "overall")
    assert many.value == pytest.approx(6.0, abs=0.3)
    assert (many.hi - many.lo) > (one.hi - one.lo)


def test_a_one_percent_gain_over_500_rounds_is_noise_and_ten_percent_is_not():
    ref_rounds = {"humaneval": bench_rounds(100, 10, 50)}
    ref = stats.tallies(evaluation("dspark", ref_rounds))
    small = stats.tallies(evaluation("ready", {"humaneval": bench_rounds(200, 10, 50, 0.01, ref_rounds["humaneval"])}))
    large = stats.tallies(evaluation("ready", {"humaneval": bench_rounds(200, 10, 50, 0.10, ref_rounds["humaneval"])}))
    assert ref.rounds == 500
    g1 = stats.gain_pct([small], [ref], "overall")
    g10 = stats.gain_pct([large], [ref], "overall")
    assert g1.value == pytest.approx(1.0, abs=0.05) and g10.value == pytest.approx(10.0, abs=0.05)
    assert g1.lo < 0 < g1.hi and not g1.excludes_zero
    assert g10.lo > 0 and g10.excludes_zero


def test_overall_pools_every_suites_prompts_as_one_ratio_of_sums():
    """One pooling everywhere: `overall` τ, TPS and P_j are ratios of sums over every prompt of every suite
    (suites with more rounds weigh more), per suite they are the evaluation's own metrics; run_metrics logs
    the pooled points, which replace ready.metrics.overall's means over suites in MLflow."""
    rounds = {"humaneval": bench_rounds(3, 10, 20), "gsm8k": bench_rounds(4, 30, 60)}  # unequal suites
    ev = evaluation("ready", rounds)
    run = stats.tallies(ev)
    per_bench = []
    for b, rs in rounds.items():
        logs = [SequenceLog(new_tokens=1 + sum(a + 1 for a in r), wall_s=0.1, accepted=r, horizons=[K] * len(r)) for r in rs]
        per_bench.append(summarize(logs, b, "ready", K))
    committed = sum(a + 1 for rs in rounds.values() for r in rs for a in r)
    n_rounds = sum(len(r) for rs in rounds.values() for r in rs)
    pooled_tau = stats.tau([run], "overall").value
    assert pooled_tau == pytest.approx(committed / n_rounds)
    assert pooled_tau != pytest.approx(overall(per_bench).tau, abs=1e-3)  # not the mean over suites
    assert stats.tau([run], "gsm8k").value == pytest.approx(per_bench[1].tau)
    band = stats.survival([run], "overall")
    hits = sum(sum(a >= 1 for a in r) for rs in rounds.values() for r in rs)
    assert band[0].value == pytest.approx(hits / n_rounds)
    assert all(iv.lo <= iv.value <= iv.hi for iv in band)
    m = stats.run_metrics(ev)
    tokens = sum(1 + sum(a + 1 for a in r) for rs in rounds.values() for r in rs)
    assert m["overall/tau"] == pooled_tau and m["overall/survival_1"] == band[0].value
    assert m["overall/tps"] == pytest.approx(tokens / (0.1 * 40))
    assert "gsm8k/tau" not in m  # per suite, ready.metrics' value is already the pooled one
    tps = stats.gain_pct([run], [run], "overall", metric="tps")
    assert (tps.value, tps.lo, tps.hi) == (0.0, 0.0, 0.0)  # a row against itself: exactly no gain


def test_survival_is_censored_beyond_each_rounds_horizon():
    # round 2 stopped at the token budget after 2 positions: it never counts at j = 3
    run = stats.tallies({"benchmarks": {"b": {"metrics": {"proposals": 3}, "prompts": [
        record(0, [3, 2], k=3, horizons=[3, 2])]}}})
    band = stats.survival([run], "b")
    assert [iv.value for iv in band] == [1.0, 1.0, 1.0]
    assert run.benchmarks["b"].observed.tolist() == [[2, 2, 1]]


def test_committed_falls_back_to_the_tokens_after_the_prefill_token():
    with_c = record(0, [2, 0, 3])
    without = record(0, [2, 0, 3], with_committed=False)
    a = stats.prompt_tallies([with_c], K)
    b = stats.prompt_tallies([without], K)
    assert a.committed.tolist() == b.committed.tolist() == [8.0] and b.rounds.tolist() == [3.0]


def test_prompts_pair_by_index_not_by_position():
    rounds, row = _row(5)
    ref_rounds, _ = _row(6)
    ev = evaluation("dspark", ref_rounds)
    ev_shuffled = evaluation("dspark", ref_rounds)
    for b in ev_shuffled["benchmarks"].values():
        b["prompts"] = b["prompts"][::-1]
    same = stats.gain_pct([row], [stats.tallies(ev)], "overall")
    flipped = stats.gain_pct([row], [stats.tallies(ev_shuffled)], "overall")
    assert same == flipped


def test_rows_over_different_prompts_are_one_clear_error():
    _, row = _row(5)
    other = stats.tallies(evaluation("dspark", {"humaneval": bench_rounds(1, 9, 50), "gsm8k": bench_rounds(2, 10, 50)}))
    with pytest.raises(stats.StatsError, match=r"^humaneval \(pair 0\): the runs decoded different prompts \(10 vs 9\)"):
        stats.gain_pct([row], [other], "humaneval")
    with pytest.raises(stats.StatsError, match="missing list 'accepted'"):
        stats.tallies({"benchmarks": {"b": {"prompts": [{"index": 0, "tokens": [1]}]}}})


def test_state_reliance_is_own_states_minus_another_prompts_states():
    rounds = {"humaneval": bench_rounds(1, 20, 50)}
    swapped = {"humaneval": bench_rounds(2, 20, 50, -0.10, rounds["humaneval"])}
    run = stats.tallies(evaluation("ready", rounds, swapped=swapped))
    own = stats.tau([run], "humaneval").value
    sr = stats.state_reliance([run], "humaneval")
    n = sum(len(r) for r in rounds["humaneval"])
    assert sr.value == pytest.approx(own - sum(a + 1 for r in swapped["humaneval"] for a in r) / n)
    assert sr.lo > 0  # the swap costs 10 % of τ: more than noise
    assert stats.state_reliance([stats.tallies(evaluation("ft", rounds))], "humaneval") is None


def test_run_metrics_names_every_interval_metric():
    rounds = {"humaneval": bench_rounds(1, 6, 20), "gsm8k": bench_rounds(2, 6, 20)}
    held = ([5, 9, 7, 4], [2, 3, 2, 1])
    m = stats.run_metrics(evaluation("ready", rounds, swapped=rounds, heldout=held))
    for b in ("humaneval", "gsm8k", "overall"):
        for name in ("tau_lo", "tau_hi", "survival_1_lo", "survival_7_hi", "state_reliance", "state_reliance_lo",
                     "state_reliance_hi"):
            assert f"{b}/{name}" in m, f"{b}/{name}"
        assert m[f"{b}/state_reliance"] == 0.0  # swapped decode identical to its own here
        assert m[f"{b}/tau_lo"] <= m[f"{b}/tau_hi"]
    assert m["heldout_tf/tau"] == pytest.approx(25 / 8)
    assert m["heldout_tf/tau_lo"] <= 25 / 8 <= m["heldout_tf/tau_hi"]
    assert stats.run_metrics({"fake": True}) == {}  # nothing per prompt: nothing to resample


def test_relative_metrics_are_named_by_their_reference():
    ref_rounds = {"humaneval": bench_rounds(1, 6, 20)}
    rows = {"humaneval": bench_rounds(2, 6, 20, 0.2, ref_rounds["humaneval"])}
    held_ref, held = ([4, 4, 4], [2, 2, 2]), ([6, 6, 5], [2, 2, 2])
    a = evaluation("ready", rows, heldout=held)
    b = evaluation("ft", ref_rounds, heldout=held_ref)
    assert sorted(stats.relative_metrics(a, b, "")) == sorted(
        f"{k}/tau_gain_pct{s}" for k in ("humaneval", "overall", "heldout_tf") for s in ("", "_lo", "_hi"))
    vs_ft = stats.relative_metrics(a, b, "ft")
    assert vs_ft["overall/tau_gain_vs_ft_pct"] == pytest.approx(20.0, abs=0.3)
    assert vs_ft["heldout_tf/tau_gain_vs_ft_pct"] == pytest.approx(100 * (17 / 6 / 2 - 1))
    assert "humaneval/tau_gain_vs_placebo_pct_hi" in stats.relative_metrics(a, b, "placebo")


def test_the_same_data_always_gives_the_same_interval():
    _, a = _row(8)
    _, b = _row(9)
    assert stats.gain_pct([a], [b], "overall") == stats.gain_pct([a], [b], "overall")
    assert stats.N_RESAMPLES >= 2000


def test_speedup_pairs_each_prompt_with_ars_timing_of_the_same_prompt():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    prompts = []
    for i in range(40):
        ar = float(rng.uniform(0.5, 2.0))  # prompts differ a lot in length/time ...
        prompts.append({**record(i, [3, 4, 2]), "wall_s": ar / float(rng.uniform(2.2, 2.8)), "ar_wall_s": ar})
    ev = {"method": "ready", "benchmarks": {"humaneval": {"metrics": {"proposals": K}, "prompts": prompts}}}
    run = stats.tallies(ev)
    ours = stats.speedup([run], "humaneval")
    wall = np.array([p["wall_s"] for p in prompts])
    ar = np.array([p["ar_wall_s"] for p in prompts])
    assert ours.value == pytest.approx(ar.sum() / wall.sum())  # same tokens: TPS ratio = time ratio
    theirs = scipy_stats.bootstrap((ar, wall), lambda a, w, axis=-1: a.sum(axis) / w.sum(axis), paired=True,
                                   vectorized=True, n_resamples=4000, method="percentile",
                                   rng=np.random.default_rng(5)).confidence_interval
    width = ours.hi - ours.lo
    assert ours.lo == pytest.approx(theirs.low, abs=0.1 * width) and ours.hi == pytest.approx(theirs.high, abs=0.1 * width)
    assert 2.2 < ours.lo < ours.hi < 2.8  # ... but pairing keeps the speedup interval tight
    m = stats.run_metrics(ev)
    assert m["humaneval/speedup_lo"] == ours.lo and "overall/speedup_hi" in m
    prompts[0]["ar_wall_s"] = 0.0  # a prompt without an AR timing: no paired speedup at all
    assert stats.speedup([stats.tallies(ev)], "humaneval") is None


def _sampled(seed, samples=3, prompts=6, rounds=20, gain=0.0, ref=None, sample_seeds=None):
    """A sampled evaluation: `samples` records per prompt (index, sample, seed), prompts shuffled in order."""
    rng = np.random.default_rng(seed)
    recs, drawn = [], {}
    for i in range(prompts):
        for s in range(samples):
            acc = ref[(i, s)] if ref is not None else [int(a) for a in rng.binomial(K, 0.3, size=rounds)]
            if ref is not None and gain:
                acc = [min(K, a + int(rng.random() < gain)) for a in acc]
            drawn[(i, s)] = acc
            rec = record(i, acc)
            rec["sample"], rec["seed"] = s, (sample_seeds or {}).get((i, s), 1000 * i + s)
            recs.append(rec)
    order = rng.permutation(len(recs))
    ev = {"method": "ready", "benchmarks": {"b": {"metrics": {"proposals": K}, "prompts": [recs[j] for j in order]}}}
    return drawn, ev


def test_samples_of_a_prompt_pool_into_one_unit_and_pair_by_prompt_and_sample():
    drawn, ref = _sampled(1)
    _, row = _sampled(2, ref=drawn, gain=0.3)
    t = stats.tallies(row).benchmarks["b"]
    assert t.size == 6 and sorted(t.index.tolist()) == list(range(6))  # the prompt stays the unit
    assert len(t.samples[0]) == 3 and t.rounds.sum() == 6 * 3 * 20
    pooled = stats.tau([stats.tallies(row)], "b").value
    assert pooled == pytest.approx(t.committed.sum() / t.rounds.sum())
    gain = stats.gain_pct([stats.tallies(row)], [stats.tallies(ref)], "b")
    assert gain.lo > 0  # every (prompt, sample) gained: the paired interval sees it
    # the prompt is the resampling unit: the same interval as one record per prompt holding all its rounds
    ref_t = stats.tallies(ref).benchmarks["b"]
    merged = [record(int(i), sum((drawn[(int(i), s)] for s in range(3)), [])) for i in ref_t.index]
    one_per_prompt = {"method": "ready", "benchmarks": {"b": {"metrics": {"proposals": K}, "prompts": merged}}}
    assert stats.tau([stats.tallies(one_per_prompt)], "b") == stats.tau([stats.tallies(ref)], "b")


def test_sampled_rows_with_other_seeds_or_samples_do_not_pair():
    drawn, ref = _sampled(1)
    _, other_seeds = _sampled(2, ref=drawn, sample_seeds={(0, 0): 7})
    with pytest.raises(stats.StatsError, match="different samples of their prompts"):
        stats.gain_pct([stats.tallies(other_seeds)], [stats.tallies(ref)], "b")
    _, fewer = _sampled(3, samples=2)
    with pytest.raises(stats.StatsError, match="different samples of their prompts"):
        stats.gain_pct([stats.tallies(fewer)], [stats.tallies(ref)], "b")
    ev = _sampled(4)[1]
    ev["benchmarks"]["b"]["prompts"].append(dict(ev["benchmarks"]["b"]["prompts"][0]))
    with pytest.raises(stats.StatsError, match="a sample appears twice"):
        stats.tallies(ev)


def test_a_greedy_row_written_with_sample_keys_pairs_with_one_written_before_sampling_existed():
    # greedy records now say `sample: 0, seed: null`; evaluations cached earlier have no such keys
    drawn, old = _row(1)
    written = evaluation("ready", drawn)
    for bench in written["benchmarks"].values():
        for rec in bench["prompts"]:
            rec.update(sample=0, seed=None)
    new = stats.tallies(written)
    assert new.benchmarks["humaneval"].samples is None
    assert stats.gain_pct([new], [old], stats.OVERALL).value == pytest.approx(0.0)


def test_a_comparison_on_a_few_differing_units_is_thin_and_gets_a_sign_test():
    """Two rows that decode differently on 2 of 3 × 64 units: no interval to read, a count and a sign test."""
    refs, rows = [], []
    for s in range(3):
        rounds = bench_rounds(50 + s, 64, 8)
        changed = [list(r) for r in rounds]
        if s == 0:  # two prompts where the row accepts nothing: both units behind the reference
            for i in [i for i, r in enumerate(rounds) if sum(r)][:2]:
                changed[i] = [0] * len(rounds[i])
        refs.append(stats.tallies(evaluation("placebo", {"b": rounds})))
        rows.append(stats.tallies(evaluation("ready", {"b": changed})))
    iv = stats.gain_pct(rows, refs, "b")
    assert iv.discordant == 2 and iv.units == 3 * 64 and iv.thin
    assert iv.ahead == 0 and iv.sign_p == pytest.approx(0.5) and iv.p_value == iv.sign_p  # 2 × 0.5²
    wide = stats.gain_pct([stats.tallies(evaluation("ready", {"b": bench_rounds(7, 64, 8)}))], refs[:1], "b")
    assert wide.discordant >= stats.MIN_DISCORDANT and not wide.thin
    assert stats.tau(rows, "b").discordant is None  # a row's own τ pairs nothing


def test_p_value_mde_and_equivalence_follow_the_t_of_the_interval():
    scipy_stats = pytest.importorskip("scipy.stats")
    iv = stats.Interval(1.0, 0.0, 2.0, se=0.5, df=4)
    assert iv.p_value == pytest.approx(2 * scipy_stats.t.sf(2.0, 4))
    assert iv.mde() == pytest.approx((scipy_stats.t.ppf(0.975, 4) + scipy_stats.t.ppf(0.8, 4)) * 0.5)
    assert stats.Interval(0.0, -1, 1, se=0.5).mde() == pytest.approx(2.8016 * 0.5, abs=1e-3)  # normal: 1.96 + 0.84
    # two one-sided tests: inside ±margin when both one-sided p's are small
    near = stats.Interval(0.1, -0.9, 1.1, se=0.3, df=30)
    assert near.tost_p(1.0) < 0.05 and near.tost_p(0.5) > 0.05
    assert near.tost_p(1.0) == pytest.approx(scipy_stats.t.sf((1.0 - 0.1) / 0.3, 30))
    typed = stats.Interval(3.0, 1.04, 4.96)  # typed in by hand: the width stands for the SE
    assert typed.std_error == pytest.approx(1.0, abs=1e-3)


def test_holm_adjusts_in_step_down_order():
    assert stats.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert stats.holm([]) == []
