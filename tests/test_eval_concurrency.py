"""`eval.concurrency`: a sweep row's evaluation decodes its prompts through a batched engine of that many
slots. Each prompt keeps its own record (rounds, accepted lengths: what the statistics resample), the
tokens stay AR's, and the row's TPS is all committed tokens over the wall time of the batched pass."""

from __future__ import annotations

import pytest
import torch

from ready.config import ConfigError, DrafterConfig, ReaderConfig
from ready.decode import DecodeError, evaluate, run_ar
from ready.decode.sampling import SamplingParams
from ready.loading import LoadedTarget
from ready.target import HybridLM
from sweeps.row import _evaluate
from sweeps.spec import SpecError, load_sweep

from tiny_models import VOCAB, small_target

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
drafter_mod = pytest.importorskip("ready.drafter")
BUDGET = 12


@pytest.fixture(scope="module")
def target() -> HybridLM:
    return small_target(num_layers=4)


def drafter(target: HybridLM, reader: bool):
    torch.manual_seed(6)
    d = drafter_mod.DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, head_rank=8),
                                  ReaderConfig(enabled=reader, rank=4, mlp_hidden=16), target).eval()
    for r in d.readers.values():
        torch.nn.init.normal_(r.fuse_out.weight, std=0.5)
    return d


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (4, 11, 2, 17, 7, 9)]


def test_a_sweep_row_evaluated_at_concurrency_4(target):
    """A ReaDy row of the rank sweep (smoke profile, eval.concurrency=4) through sweeps.row's evaluation:
    the AR generations and the drafting pass are batched 4 at a time, the record says so, every prompt has
    its own rounds, and they equal those of the same row at concurrency 1."""
    over = ["profile=smoke", "eval.heldout_tf_samples=0", f"eval.max_new_tokens={BUDGET}", "eval.warmup_rounds=0"]
    rows = {c: load_sweep("rank", over + [f"eval.concurrency={c}"]).common for c in (1, 4)}
    assert rows[4].eval.concurrency == 4 and rows[1].eval.concurrency == 1
    loaded = LoadedTarget(target=target, tokenizer=None, eos=None, target_path="tiny (test)", device="cpu")
    suites = {"toy": prompts()}
    d = drafter(target, reader=True)
    records = {}
    for c, cfg in rows.items():
        ar = {"toy": run_ar(target, suites["toy"], BUDGET, warmup=0, progress=False, concurrency=c)}
        records[c] = _evaluate(cfg, "ready", loaded, d, suites, ar, progress=False)["benchmarks"]["toy"]
    batched, single = records[4], records[1]
    assert batched["concurrency"] == 4 and single["concurrency"] == 1
    assert batched["lossless"] == 1 and batched["lossless_exact"] == 1
    assert len(batched["prompts"]) == len(suites["toy"])
    for b, s in zip(batched["prompts"], single["prompts"]):
        assert (b["index"], b["tokens"], b["accepted"], b["horizons"], b["committed"]) == \
            (s["index"], s["tokens"], s["accepted"], s["horizons"], s["committed"])
        assert b["wall_s"] > 0 and b["ar_wall_s"] > 0
    m = batched["metrics"]
    assert m["rounds"] == single["metrics"]["rounds"] and m["tau"] == single["metrics"]["tau"]
    assert m["tps"] == pytest.approx(m["new_tokens"] / sum(p["wall_s"] for p in batched["prompts"]))
    # the state swap (another prompt's states) decodes through the batched engine at any concurrency: the same tau
    assert batched["state_swap"]["tau"] == single["state_swap"]["tau"]


def test_evaluate_batched_ar_and_dspark_pass_with_per_prompt_records(target):
    ps = prompts()
    res1 = evaluate(target, drafter(target, reader=False), ps, BUDGET, warmup=0, progress=False)
    res4 = evaluate(target, drafter(target, reader=False), ps, BUDGET, warmup=1, progress=False, concurrency=4,
                    interleave_ar=True)
    assert res4.concurrency == 4 and res4.lossless == 1 and res4.lossless_exact == 1
    assert [p.accepted for p in res4.prompts] == [p.accepted for p in res1.prompts]
    assert [p.tokens for p in res4.prompts] == [p.tokens for p in res1.prompts]
    assert res4.metrics.wall_s == pytest.approx(sum(p.wall_s for p in res4.prompts))
    assert res4.ar.wall_s == pytest.approx(sum(p.ar_wall_s for p in res4.prompts))


def test_concurrency_is_checked(target):
    with pytest.raises(DecodeError, match="integer >= 1"):
        evaluate(target, None, prompts(), 4, progress=False, concurrency=0)
    with pytest.raises((ConfigError, SpecError), match="an integer >= 1"):
        load_sweep("rank", ["profile=smoke", "eval.concurrency=0"])
    assert load_sweep("rank", ["profile=smoke", "eval.concurrency=4", "eval.temperature=1.0"]).common.eval.concurrency == 4


def test_sampled_evaluation_at_concurrency_4_gives_every_generation_its_batch_one_draws(target):
    """Temperature 1, 2 samples a prompt: the AR and ReaDy passes batched 4 at a time draw, generation by
    generation, what one at a time draws with the same seeds (tokens, accepted lengths), each generation
    passes the distribution check on its traced rounds, and the placebo's donors follow their units."""
    ps, t1 = prompts(), SamplingParams(temperature=1.0, top_p=0.95, seed=3)
    d = drafter(target, reader=True)
    kw = dict(sampling=t1, samples=2, warmup=0, progress=False, benchmark="toy")
    ar1 = run_ar(target, ps, BUDGET, progress=False, sampling=t1, samples=2, stream="toy", warmup=0)
    ar4 = run_ar(target, ps, BUDGET, progress=False, sampling=t1, samples=2, stream="toy", warmup=0, concurrency=4)
    assert [g.tokens for g in ar4] == [g.tokens for g in ar1]
    for donors in (None, [(i + 1) % len(ps) for i in range(len(ps))]):
        one = evaluate(target, d, ps, BUDGET, ar=ar1, donors=donors, **kw)
        four = evaluate(target, d, ps, BUDGET, ar=ar1, donors=donors, concurrency=4, **kw)
        assert four.concurrency == 4 and four.lossless == four.dist_valid == 1
        assert [(r.index, r.sample, r.seed, r.tokens, r.accepted) for r in four.prompts] == \
            [(r.index, r.sample, r.seed, r.tokens, r.accepted) for r in one.prompts]
        assert all(r.dist_rounds >= 1 and r.rule_err < 1e-6 for r in four.prompts)
    greedy = evaluate(target, d, ps, BUDGET, warmup=0, progress=False, concurrency=4)
    assert [r.tokens for r in four.prompts[::2]] != [r.tokens for r in greedy.prompts]
