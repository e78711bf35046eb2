"""Sampling pieces and their plumbing: the warp and the draw, the drafter's q (conditioned on the token it
drew, equal to the training path's), temperature 0 is the greedy path, seeds reproduce and pair rows, and
the evaluation's distribution check fails loudly on a planted state leak or a mis-reported q.
(Exactness itself: tests/test_sampling_exact.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch

from ready.decode import DecodeError, Engine, LosslessWarning, NgramDrafter, evaluate
from ready.decode.sampling import DraftSampling, SamplingParams, draw, position_law, warp
from ready.target.layers import commit_gdn
from tests.test_drafter import V, draft_step, drafter_for, teacher, tiny_target

T1 = SamplingParams(1.0, 1.0, 0)


@pytest.fixture(scope="module")
def target():
    model = tiny_target()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked distributions: the drafter's drafts get rejected at times
    return model


def test_top_p_keeps_the_smallest_nucleus_and_temperature_divides_the_logits():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert torch.allclose(warp(logits, 1.0, 0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    kept = warp(logits, 1.0, 0.81)
    assert (kept > 0).tolist() == [True, True, True, False] and kept.sum() == pytest.approx(1.0)
    assert (warp(logits, 1.0, 0.01) > 0).sum() == 1  # the top token always stays
    assert torch.allclose(warp(logits, 0.5, 1.0), torch.softmax(logits / 0.5, -1))


def test_draw_gives_each_token_its_share_of_the_unit_interval_and_never_a_zero_mass_token():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    n = 1000
    u = (torch.arange(n, dtype=torch.float32) + 0.5) / n
    counts = torch.bincount(draw(probs.expand(n, -1), u), minlength=5)
    assert counts.tolist() == [100, 0, 600, 300, 0]
    top = torch.tensor(1.0 - 2.0**-24)  # the largest float32 uniform: rounding puts u * total at the top
    assert int(draw(torch.tensor([0.3, 0.7 + 1e-7, 0.0, 0.0]), top)) == 1


def test_position_law_is_the_target_for_a_normalised_q_and_not_for_a_halved_one():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 7, generator=g), -1)
    q = torch.softmax(torch.randn(3, 7, generator=g), -1)
    assert (position_law(p, q) - p.double()).abs().max() < 1e-7
    assert (position_law(p, q * 0.5) - p.double()).abs().max() > 1e-2


def test_the_drafter_samples_each_position_after_the_token_it_drew_with_the_training_distribution(target):
    d = drafter_for(target)
    prompt = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))
    u = torch.rand(2, d.proposals, generator=torch.Generator().manual_seed(2))
    toks, q = d.sample(draft_step(target, d, prompt), DraftSampling(0.8, 0.9, u))
    assert toks.shape == (2, 4) and q.shape == (2, 4, V) and q.dtype == torch.float32
    assert torch.equal(draw(q, u), toks)  # every token drawn from the q reported for it
    # teacher-forced on the sampled tokens, the training path gives the same q (the head saw the drawn token)
    ids = torch.cat([prompt, toks, torch.zeros(2, 1, dtype=torch.long)], dim=1)
    anchors = torch.full((2, 1), prompt.shape[1] - 1)
    hidden, states = teacher(target, d, ids, anchors)
    train = d.forward_train(ids, hidden, anchors, states)[:, 0]
    torch.testing.assert_close(warp(train, 0.8, 0.9), q, rtol=1e-4, atol=1e-5)
    greedy_q = warp(d.draft(draft_step(target, d, prompt))[1], 0.8, 0.9)
    assert not torch.allclose(greedy_q[:, 1:], q[:, 1:], atol=1e-3)  # conditioned on the drawn, not the argmax, token


def test_the_static_draft_step_samples_the_same_as_the_eager_one(target):
    eager, static = drafter_for(target), drafter_for(target)
    static.cuda_graphs = True
    prompt = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(3))
    u = torch.rand(1, eager.proposals, generator=torch.Generator().manual_seed(4))
    te, qe = eager.sample(draft_step(target, eager, prompt), DraftSampling(1.0, 1.0, u))
    ts, qs = static.sample(draft_step(target, static, prompt), DraftSampling(1.0, 1.0, u))
    assert torch.equal(te, ts)
    torch.testing.assert_close(qs, qe, rtol=1e-4, atol=1e-5)
    assert static.draft(draft_step(target, static, prompt))[0].shape == (1, 4)  # greedy has its own step


def test_temperature_zero_is_the_greedy_path(target):
    d = drafter_for(target)
    prompt = list(range(1, 12))
    want = Engine(target, d).generate(prompt, 20)
    got = Engine(target, d, sampling=SamplingParams(0.0, 0.5, 3)).generate(prompt, 20, seed=9)
    assert (got.tokens, got.accepted, got.committed) == (want.tokens, want.accepted, want.committed)


def test_a_seed_reproduces_a_sampled_generation_and_another_seed_differs(target):
    d = drafter_for(target)
    engine = Engine(target, d, sampling=T1)
    a, b, c = (engine.generate([5, 6, 7], 24, seed=s) for s in (1, 1, 2))
    assert (a.tokens, a.accepted) == (b.tokens, b.accepted) and a.tokens != c.tokens


def test_bad_sampling_settings_are_one_clear_error(target):
    with pytest.raises(DecodeError, match="temperature=-1"):
        SamplingParams(-1.0)
    with pytest.raises(DecodeError, match=r"top_p=0.0; expected a number in \(0, 1\]"):
        SamplingParams(1.0, 0.0)
    with pytest.raises(DecodeError, match="cannot be combined with sampling"):
        Engine(target, NgramDrafter(V, 3), sampling=T1, accept_fn=lambda d, a: 0)


def test_sampled_evaluation_pairs_every_row_by_prompt_sample_and_seed(target):
    prompts = [[1, 2, 3, 4, 1, 2, 3], [9, 8, 7]]
    d = drafter_for(target)
    a = evaluate(target, d, prompts, 12, sampling=T1, samples=3, warmup=0, progress=False, method="ready")
    b = evaluate(target, NgramDrafter(V, 4), prompts, 12, sampling=T1, samples=3, warmup=0, progress=False)
    keys = [(r.index, r.sample, r.seed) for r in a.prompts]
    assert keys == [(r.index, r.sample, r.seed) for r in b.prompts] and len(keys) == 6
    assert len({seed for _, _, seed in keys}) == 6
    assert a.lossless == b.lossless == 1 and a.lossless_exact is None and a.sampling["samples"] == 3
    assert all(r.dist_rounds >= 1 and r.rule_err < 1e-6 and r.state_err < 1 for r in a.prompts)
    other_bench = evaluate(target, d, prompts, 12, sampling=T1, samples=3, warmup=0, progress=False, benchmark="x")
    assert {r.seed for r in other_bench.prompts}.isdisjoint({seed for _, _, seed in keys})


def test_a_rejected_draft_left_in_the_states_fails_the_distribution_check(target, monkeypatch):
    d = drafter_for(target)
    real_commit = type(target).commit

    def leaky_commit(self, cache, n):  # the GDN state after the first rejected draft is kept: it leaves a trace
        pending, leaked = cache.pending, cache.ssm.clone()
        commit_gdn(leaked, cache.conv.clone(), cache.pending_inputs, cache.pending_conv, min(n + 1, pending),
                   pending_states=cache.pending_states)
        real_commit(self, cache, n)
        if n < pending:
            cache.ssm.copy_(leaked)

    monkeypatch.setattr(type(target), "commit", leaky_commit)
    with pytest.warns(LosslessWarning, match="states check failed"):
        res = evaluate(target, d, [[3, 1, 4, 1, 5]], 16, sampling=T1, samples=2, warmup=0, progress=False,
                       check_rounds=4)
    assert res.lossless == 0 and res.state_err > 1


def test_a_drafter_reporting_another_q_than_it_drew_from_fails_the_rule_check(target):
    d = drafter_for(target)

    class Halved:  # draws from q but reports q / 2: not the distribution of its drafts
        proposals, vocab_size, capture_layers = d.proposals, d.vocab_size, d.capture_layers

        def begin(self, ids):
            d.begin(ids)

        def propose(self, step):
            return d.propose(step)

        def sample(self, step, sampling):
            toks, q = d.sample(step, sampling)
            return toks, q * 0.5

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = evaluate(target, Halved(), [[2, 7, 1, 8]], 12, sampling=T1, samples=1, warmup=0, progress=False)
    assert res.lossless == 0 and res.rule_err > 1e-3
    assert any(issubclass(w.category, LosslessWarning) and "rule check failed" in str(w.message) for w in caught)


def scored_drafter(target):
    """A DSpark drafter with a confidence head whose confidences fall on both sides of 0.5."""
    d = drafter_for(target, confidence_head=True)
    with torch.no_grad():
        torch.nn.init.normal_(d.confidence_head.proj.weight, std=0.15)
    return d


@pytest.mark.parametrize("concurrency", [1, 3])
def test_sampled_evaluation_under_a_confidence_schedule_passes_the_distribution_check(target, concurrency):
    """Every traced round verified exactly the drafts the threshold keeps from its confidences (the schedule
    check), and the rule and state checks pass on what it verified."""
    from ready.decode.schedule import VerifySchedule

    res = evaluate(target, scored_drafter(target), [[3, 1, 4, 1, 5], [2, 7, 1]], 16, sampling=T1, samples=2,
                   warmup=0, progress=False, check_rounds=4, concurrency=concurrency,
                   verify_schedule=VerifySchedule("confidence", 0.5))
    assert res.lossless == 1 and res.rule_err < 1e-6 and res.state_err < 1 and res.dist_rounds > 0
    verified = [n for p in res.prompts for n in p.verified]
    assert min(verified) < 4 and res.verification["verify_schedule"] == "confidence"


def test_a_round_that_verifies_past_its_confidence_schedule_fails_the_schedule_check(target, monkeypatch):
    """An engine whose schedule says `confidence` but verifies every draft: caught by the schedule check."""
    from ready.decode.schedule import VerifySchedule

    schedule = VerifySchedule("confidence", 0.5)
    object.__setattr__(schedule, "lengths", lambda conf, room: list(room))  # the planted bug: ignore the head
    with pytest.warns(LosslessWarning, match="schedule check failed"):
        res = evaluate(target, scored_drafter(target), [[3, 1, 4, 1, 5], [2, 7, 1]], 16, sampling=T1, samples=2,
                       warmup=0, progress=False, check_rounds=16, verify_schedule=schedule)
    assert res.lossless == 0


@pytest.mark.cuda
@pytest.mark.parametrize("head", ["vanilla", "none"])  # none: a DFlash drafter, no Markov head
def test_on_cuda_the_captured_sampled_draft_step_and_graphed_engine_match_eager(head):
    tgt = tiny_target().cuda()
    with torch.no_grad():
        tgt.lm_head.weight.mul_(8.0)
    eager, graphed = drafter_for(tgt, head=head).cuda(), drafter_for(tgt, head=head).cuda()
    eager.cuda_graphs = False
    prompt = list(range(1, 14))
    want = Engine(tgt, eager, sampling=T1, cuda_graphs=False).generate(prompt, 24, seed=5)
    engine = Engine(tgt, graphed, sampling=T1)  # verify and the draft step replayed from CUDA graphs
    got = engine.generate(prompt, 24, seed=5)
    assert graphed._graphs and all(g.graph is not None and g.mode == (1.0, 1.0) for g in graphed._graphs)
    assert (got.tokens, got.accepted) == (want.tokens, want.accepted)
    res = evaluate(tgt, graphed, [prompt, prompt[:5]], 16, sampling=T1, samples=2, warmup=1, progress=False)
    assert res.lossless == 1 and res.rule_err < 1e-6 and res.state_err < 1
