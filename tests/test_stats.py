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


def test_hierarchical_interval_matches_a_plain_loop_over_seeds_then_prompts():
    seeds = [(_row(10 + s), _row(20 + s)) for s in range(3)]
    refs = [r for (_, r), _ in seeds]
    rows = [r for _, (_, r) in seeds]
    ours = stats.gain_pct(rows, refs, "overall")

    rng = np.random.default_rng(99)
    benches = ("gsm8k", "humaneval")
    draws = []
    for _ in range(2000):
        pooled = {b: np.zeros(4) for b in benches}
        for _slot in range(3):
            s = rng.integers(3)
            for b in benches:
                idx = rng.integers(0, 10, size=10)
                ca, na = _sums(rows[s], b)
                cb, nb = _sums(refs[s], b)
                pooled[b] += [ca[idx].sum(), na[idx].sum(), cb[idx].sum(), nb[idx].sum()]
        tau_a = np.mean([p[0] / p[1] for p in pooled.values()])
        tau_b = np.mean([p[2] / p[3] for p in pooled.values()])
        draws.append(100 * (tau_a / tau_b - 1))
    lo, hi = np.percentile(draws, [2.5, 97.5])
    width = hi - lo
    assert ours.lo == pytest.approx(lo, abs=0.12 * width) and ours.hi == pytest.approx(hi, abs=0.12 * width)
    # the point estimate pools every seed's prompts: mean over benchmarks of Σc / Σn
    full = [[sum(_sums(r, b)[i].sum() for r in rs) for i in (0, 1)] for rs in (rows, refs) for b in benches]
    tau_a = np.mean([c / n for c, n in full[:2]])
    tau_b = np.mean([c / n for c, n in full[2:]])
    assert ours.value == pytest.approx(100 * (tau_a / tau_b - 1))


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


def test_point_estimates_are_the_metrics_the_evaluation_reports():
    rounds, run = _row(3)
    per_bench = []
    for b, rs in rounds.items():
        logs = [SequenceLog(new_tokens=1 + sum(a + 1 for a in r), wall_s=0.1, accepted=r, horizons=[K] * len(r)) for r in rs]
        per_bench.append(summarize(logs, b, "ready", K))
    total = overall(per_bench)
    assert stats.tau([run], "overall").value == pytest.approx(total.tau)
    assert stats.tau([run], "gsm8k").value == pytest.approx(per_bench[1].tau)
    band = stats.survival([run], "overall")
    assert [iv.value for iv in band] == pytest.approx(total.survival)
    assert all(iv.lo <= iv.value <= iv.hi for iv in band)
    tps = stats.gain_pct([run], [run], "overall", metric="tps")
    assert (tps.value, tps.lo, tps.hi) == (0.0, 0.0, 0.0)  # a row against itself: exactly no gain


def test_survival_is_censored_beyond_each_rounds_horizon():
    # round 2 stopped at the token budget after 2 positions: it never counts at j = 3
    run = stats.tallies({"benchmarks": {"b": {"metrics": {"block_size": 3}, "prompts": [
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
    rounds = {"humaneval": bench_rounds(1, 10, 50)}
    swapped = {"humaneval": bench_rounds(2, 10, 50, -0.10, rounds["humaneval"])}
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
    ev = {"method": "ready", "benchmarks": {"humaneval": {"metrics": {"block_size": K}, "prompts": prompts}}}
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
    ev = {"method": "ready", "benchmarks": {"b": {"metrics": {"block_size": K}, "prompts": [recs[j] for j in order]}}}
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
    one_per_prompt = {"method": "ready", "benchmarks": {"b": {"metrics": {"block_size": K}, "prompts": merged}}}
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
