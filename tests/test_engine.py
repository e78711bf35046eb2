"""The decoding engine: speculative output equals AR greedy token for token (lossless), rounds
are settled as the paper defines them, drafters get the context the protocol promises, and bad
input ends in one clear message."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from ready.decode import (
    DecodeError, DraftStep, Engine, Generation, LosslessWarning, NgramDrafter, evaluate, greedy_accept, run_ar,
    settle_round,
)
from ready.metrics import survival, tau
from ready.target import HybridConfig, HybridLM

VOCAB = 128
# tiny models: one thread is much faster than two on a shared, loaded machine (spin-waits)
torch.set_num_threads(1)


def tiny_config(**kw) -> HybridConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    return HybridConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def target() -> HybridLM:
    torch.manual_seed(1234)
    return HybridLM(tiny_config()).eval()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 5, 9, 17, 30])
        if i % 3 == 2:  # a repetitive prompt, where prompt lookup has something to find
            out.append(([rng.randrange(VOCAB) for _ in range(4)] * 8)[:length])
        else:
            out.append([rng.randrange(VOCAB) for _ in range(length)])
    return out


def reference_greedy(model: HybridLM, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by full forwards without any cache: the independent reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


# --- drafters used by the tests ---------------------------------------------------------------
class ReplayDrafter:
    """Knows the AR continuation of each prompt; proposes it correctly up to position `right`
    (clipped to K), and deliberately wrong tokens after that; `p_right` draws `right` per round."""

    def __init__(self, references: dict[tuple, list[int]], proposals: int, right: int | None = None,
                 p_right: float | None = None, seed: int = 0):
        self.references, self.proposals, self.vocab_size = references, proposals, VOCAB
        self.capture_layers: list[int] = []
        self.right, self.p_right, self.rng = right, p_right, random.Random(seed)
        self.full: list[int] = []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        prompt = tuple(prompt_ids[0].tolist())
        self.full = list(prompt) + self.references[prompt]

    def propose(self, step: DraftStep) -> torch.Tensor:
        t = step.tokens.shape[1]
        truth = (self.full[t:] + [0] * self.proposals)[: self.proposals]
        if self.p_right is not None:
            right = 0
            while right < self.proposals and self.rng.random() < self.p_right:
                right += 1
        else:
            right = self.proposals if self.right is None else self.right
        out = [tok if j < right else (tok + 1) % VOCAB for j, tok in enumerate(truth)]
        return torch.tensor([out])


class RecordingDrafter:
    """Checks, every round, that the DraftStep is what the protocol promises."""

    def __init__(self, target: HybridLM, proposals: int, capture_layers: list[int]):
        self.target, self.proposals, self.vocab_size = target, proposals, VOCAB
        self.capture_layers = capture_layers
        self.rounds = 0

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.prompt = prompt_ids.clone()

    def propose(self, step: DraftStep) -> torch.Tensor:
        tokens = step.tokens
        assert torch.equal(tokens[:, : self.prompt.shape[1]], self.prompt)
        assert step.cache.length == tokens.shape[1] - 1  # every committed token but the last is in the cache
        full = self.target(tokens[:, :-1], capture_layers=self.capture_layers).hidden
        assert step.features.shape == full.shape
        torch.testing.assert_close(step.features, full, atol=1e-4, rtol=1e-4)
        # committed states equal a fresh prefill of the same tokens
        fresh = self.target.new_cache(1, 256)
        self.target.prefill(tokens[:, :-1], fresh)
        torch.testing.assert_close(step.cache.ssm, fresh.ssm, atol=1e-4, rtol=1e-4)
        self.rounds += 1
        return tokens[:, -1:].repeat(1, self.proposals)  # "the last token again": some right, most wrong


# --- round settlement (hand-built) -----------------------------------------------------------------
def test_greedy_accept_counts_the_matching_prefix_only():
    assert greedy_accept(torch.tensor([5, 6, 7]), torch.tensor([5, 6, 9, 1])) == 2
    assert greedy_accept(torch.tensor([5, 6, 7]), torch.tensor([4, 6, 7, 1])) == 0  # later matches don't count
    assert greedy_accept(torch.tensor([5, 6, 7]), torch.tensor([5, 6, 7, 1])) == 3


@pytest.mark.parametrize(
    "drafts, argmax, raw, remaining, eos, expect",
    [
        # rejected at position 3: accepted drafts + the target's correction
        ([5, 6, 7], [5, 6, 9, 1], 2, 10, None, (2, 3, [5, 6, 9], False)),
        # all accepted: the bonus token is appended
        ([5, 6, 7], [5, 6, 7, 8], 3, 10, None, (3, 3, [5, 6, 7, 8], False)),
        # budget of 2 cuts the block: position 3 censored, no bonus
        ([5, 6, 7], [5, 6, 7, 8], 3, 2, None, (2, 2, [5, 6], False)),
        # budget of 2, rejected at 2 (observed): correction fits the budget
        ([5, 6, 7], [5, 9, 7, 8], 1, 2, None, (1, 2, [5, 9], False)),
        # an accepted EOS draft ends the sequence: positions after it censored
        ([5, 6, 7], [5, 6, 7, 8], 3, 10, 6, (2, 2, [5, 6], True)),
        # EOS as the correction token: horizon not cut
        ([5, 6, 7], [5, 9, 7, 8], 1, 10, 9, (1, 3, [5, 9], True)),
        # a rejected EOS draft changes nothing
        ([5, 6, 7], [5, 2, 7, 8], 1, 10, 6, (1, 3, [5, 2], False)),
    ],
)
def test_settle_round(drafts, argmax, raw, remaining, eos, expect):
    r = settle_round(drafts, argmax, raw, remaining, eos)
    assert (r.accepted, r.horizon, r.tokens, r.eos) == expect
    assert r.commit == r.accepted + 1
    # every proposed draft verified (the full schedule): naming K changes nothing
    assert settle_round(drafts, argmax, raw, remaining, eos, proposals=len(drafts)) == r


@pytest.mark.parametrize(
    "drafts, argmax, raw, remaining, eos, expect",
    [
        # K = 4, the schedule verified 1 draft and it was accepted: A = 1, position 2 a stop (horizon 4)
        ([5], [5, 8], 1, 10, None, (1, 4, [5, 8], False)),
        # the anchor alone verified: A = 0, position 1 a stop, the target's token appended
        ([], [8], 0, 10, None, (0, 4, [8], False)),
        # verified 2, rejected at 2: as under the full schedule
        ([5, 6], [5, 9, 7], 1, 10, None, (1, 4, [5, 9], False)),
        # the budget still censors: 3 tokens left, horizon 3 whatever the schedule verified
        ([5], [5, 8], 1, 3, None, (1, 3, [5, 8], False)),
        # one token left: horizon 1, the accepted draft fills the budget, no bonus
        ([5], [5, 8], 1, 1, None, (1, 1, [5], False)),
        # an accepted EOS draft still cuts the horizon
        ([5, 6], [5, 6, 7], 2, 10, 6, (2, 2, [5, 6], True)),
    ],
)
def test_settle_round_schedule_cut_is_a_stop_not_censoring(drafts, argmax, raw, remaining, eos, expect):
    """Issue 74 item 5: a round whose confidence schedule verified n < K drafts has the budget's horizon
    min(K, remaining) (cut at an accepted EOS), not n; the tokens and the commit are as before."""
    r = settle_round(drafts, argmax, raw, remaining, eos, proposals=4)
    assert (r.accepted, r.horizon, r.tokens, r.eos) == expect
    assert r.commit == r.accepted + 1
    assert r.tokens == settle_round(drafts, argmax, raw, remaining, eos).tokens  # what is appended is unchanged


def test_tau_of_schedule_cut_rounds_is_not_biased_up():
    """Rounds that verify v < K drafts and accept every one commit v + 1 tokens: tau is 1 + mean A, not the
    survival of censored rounds (which reads P_j = 1 wherever any round accepted up to j)."""
    k = 4
    one = settle_round([5], [5, 8], 1, 100, None, proposals=k)  # verified 1, accepted it
    assert tau([one.accepted] * 10, [one.horizon] * 10, k) == pytest.approx(2.0)
    mixed = [settle_round([5] * v, [5] * (v + 1), v, 100, None, proposals=k) for v in (0, 1, 1, 2, 4)]
    acc, hor = [r.accepted for r in mixed], [r.horizon for r in mixed]
    assert tau(acc, hor, k) == pytest.approx(1 + sum(acc) / len(acc))
    assert tau(acc, hor, k) == pytest.approx(sum(len(r.tokens) for r in mixed) / len(mixed))


# --- n-gram drafter ---------------------------------------------------------------------------------
def step_of(tokens: list[int]) -> DraftStep:
    return DraftStep(tokens=torch.tensor([tokens]), features=None, target=None, cache=None)  # type: ignore[arg-type]


def test_ngram_proposes_the_continuation_of_the_latest_longest_match():
    d = NgramDrafter(VOCAB, proposals=3, max_ngram=2)
    # suffix (1, 2) occurs at 0 and 4; the latest earlier match (4) is followed by 9, 1, 2
    assert d.propose(step_of([1, 2, 3, 0, 1, 2, 9, 1, 2])).tolist() == [[9, 1, 2]]
    # no bigram match: falls back to the unigram 7 -> followed by 8
    assert d.propose(step_of([7, 8, 5, 6, 7])).tolist() == [[8, 5, 6]]


def test_ngram_extends_a_repeating_pattern_past_the_end():
    d = NgramDrafter(VOCAB, proposals=5, max_ngram=2)
    assert d.propose(step_of([4, 1, 2, 1, 2])).tolist() == [[1, 2, 1, 2, 1]]


def test_ngram_without_match_repeats_the_last_token():
    d = NgramDrafter(VOCAB, proposals=3)
    assert d.propose(step_of([3])).tolist() == [[3, 3, 3]]
    assert d.propose(step_of([1, 2, 3])).tolist() == [[3, 3, 3]]


# --- lossless -----------------------------------------------------------------------------------------
N_NEW = 24


@pytest.fixture(scope="module")
def ar_refs(target):
    refs = {}
    for p in prompts(9):
        refs[tuple(p)] = Engine(target).generate(p, N_NEW).tokens
    return refs


def test_ar_engine_equals_greedy_by_full_forwards(target, ar_refs):
    for p in prompts(4):
        assert ar_refs[tuple(p)] == reference_greedy(target, p, N_NEW)


def test_the_greedy_ar_step_commits_before_the_host_reads_its_token(target, ar_refs, monkeypatch):
    """Each AR step's commit is queued right behind its pass, before the device->host read of the token
    (the read waits for the device; a commit after it would wait for the host), with the same tokens."""
    events: list[str] = []
    commit, tolist = target.commit, torch.Tensor.tolist
    monkeypatch.setattr(target, "commit", lambda cache, n: (events.append("commit"), commit(cache, n))[1])
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: (events.append("read"), tolist(t))[1])
    p = prompts(1)[0]
    gen = Engine(target).generate(p, 6)
    assert gen.tokens == ar_refs[tuple(p)][:6]
    steps = events[events.index("commit"):]  # from the first step on (the prompt's own read comes before)
    assert steps == ["commit", "read"] * 5


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("kind", ["ngram", "oracle", "wrong", "noisy"])
def test_speculative_equals_ar_greedy(target, ar_refs, k, kind):
    drafter = {
        "ngram": lambda: NgramDrafter(VOCAB, k),
        "oracle": lambda: ReplayDrafter(ar_refs, k),
        "wrong": lambda: ReplayDrafter(ar_refs, k, right=0),
        "noisy": lambda: ReplayDrafter(ar_refs, k, p_right=0.7, seed=k),
    }[kind]()
    engine = Engine(target, drafter)
    for p in prompts(9):
        gen = engine.generate(p, N_NEW)
        assert gen.tokens == ar_refs[tuple(p)], f"prompt {p}"
        assert len(gen.tokens) == N_NEW and gen.stop == "budget"
        assert all(0 <= a <= h <= k for a, h in zip(gen.accepted, gen.horizons))
        if kind == "oracle":
            assert gen.accepted == gen.horizons  # every observable draft accepted
            assert len(gen.accepted) == -(-(N_NEW - 1) // (k + 1))  # ceil((N-1)/(K+1)) rounds
        if kind == "wrong":
            assert set(gen.accepted) == {0} and len(gen.accepted) == N_NEW - 1


def test_noisy_drafter_exercises_every_acceptance_length(target, ar_refs):
    engine = Engine(target, ReplayDrafter(ar_refs, 3, p_right=0.6, seed=1))
    seen = set()
    for p in prompts(9):
        seen.update(engine.generate(p, N_NEW).accepted)
    assert seen == {0, 1, 2, 3}


def test_budget_cut_rounds_are_censored_not_rejected(target, ar_refs):
    p = prompts(1)[0]
    gen = Engine(target, ReplayDrafter(ar_refs, 7)).generate(p, 12)
    # 1 token from prefill, then one full round (8 tokens), then 3 left: horizon 3, all accepted
    assert gen.accepted == [7, 3] and gen.horizons == [7, 3]
    assert gen.tokens == ar_refs[tuple(p)][:12]
    assert survival(gen.accepted, gen.horizons, 7) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def test_eos_stops_ar_and_speculative_at_the_same_token(target, ar_refs):
    p = prompts(9)[4]
    ref = ar_refs[tuple(p)]
    eos = ref[10]
    stop = ref.index(eos) + 1
    for drafter in (None, NgramDrafter(VOCAB, 3), ReplayDrafter(ar_refs, 7), ReplayDrafter(ar_refs, 3, right=0)):
        gen = Engine(target, drafter, eos_token_id=eos).generate(p, N_NEW)
        assert gen.tokens == ref[:stop] and gen.stop == "eos"


def test_eos_inside_an_accepted_block_censors_the_rest(target, ar_refs):
    p = prompts(9)[4]
    ref = ar_refs[tuple(p)]
    eos = ref[3]
    assert eos not in ref[:3]
    gen = Engine(target, ReplayDrafter(ar_refs, 7), eos_token_id=eos).generate(p, N_NEW)
    assert gen.tokens == ref[:4]
    assert gen.accepted == [3] and gen.horizons == [3]  # the EOS draft is position 3; 4..7 censored


def test_drafter_sees_committed_tokens_features_and_states(target):
    drafter = RecordingDrafter(target, 3, capture_layers=[0, 2, 3])
    gen = Engine(target, drafter).generate([5, 9, 11, 5, 9], 16)
    assert drafter.rounds == len(gen.accepted) >= 4
    assert gen.tokens == reference_greedy(target, [5, 9, 11, 5, 9], 16)


def test_engine_reuses_its_cache_across_prompts_of_different_lengths(target, ar_refs):
    engine = Engine(target, NgramDrafter(VOCAB, 3))
    engine.reserve(64)
    for p in reversed(prompts(9)):  # long and short prompts interleaved, one cache
        assert engine.generate(p, N_NEW).tokens == ar_refs[tuple(p)]


def test_forced_acceptance_replays_the_given_lengths(target):
    forced = iter([2, 0, 3, 1] * 10)
    engine = Engine(target, NgramDrafter(VOCAB, 3), accept_fn=lambda d, a: next(forced))
    gen = engine.generate([1, 2, 3], 12)
    assert gen.accepted[:4] == [2, 0, 3, 1]
    assert len(gen.tokens) == 12


# --- evaluate -----------------------------------------------------------------------------------------
def test_evaluate_reports_lossless_metrics_and_speedup(target):
    ps = prompts(6)
    res = evaluate(target, NgramDrafter(VOCAB, 3), ps, 16, benchmark="toy", method="ngram", warmup=0, progress=False)
    assert res.lossless == 1 and res.mismatch is None and res.metrics.lossless == 1
    assert res.metrics.new_tokens == res.ar.new_tokens == 6 * 16
    assert res.metrics.rounds == sum(len(p.accepted) for p in res.prompts)
    assert res.ar.tau == 1.0 and res.metrics.tau >= 1.0
    assert res.metrics.speedup == pytest.approx(res.metrics.tps / res.ar.tps)
    assert len(res.metrics.survival) == 3
    res.to_dict()


def test_evaluate_flags_a_lossless_failure_loudly(target, capsys):
    ps = prompts(3)
    ar = run_ar(target, ps, 10, warmup=0, progress=False)
    broken = [Generation(prompt_len=g.prompt_len, tokens=list(g.tokens), proposals=0, accepted=g.accepted,
                         horizons=g.horizons, wall_s=g.wall_s) for g in ar]
    broken[1].tokens[6] = (broken[1].tokens[6] + 1) % VOCAB
    with pytest.warns(LosslessWarning, match="prompt 1, new token 6"):
        res = evaluate(target, NgramDrafter(VOCAB, 3), ps, 10, ar=broken, warmup=0, progress=False)
    assert res.lossless == 0 and res.metrics.lossless == 0
    assert (res.mismatch.prompt_index, res.mismatch.position) == (1, 6)
    assert res.mismatch.expected == broken[1].tokens[6] and res.mismatch.got == ar[1].tokens[6]
    assert "LOSSLESS FAILURE" in capsys.readouterr().err


# --- bad input ------------------------------------------------------------------------------------------
def test_empty_prompt_is_refused(target):
    with pytest.raises(DecodeError, match="prompt is empty"):
        Engine(target).generate([], 4)


def test_prompt_longer_than_the_context_is_refused(target):
    with pytest.raises(DecodeError, match="exceeds the model's context of 256 tokens"):
        Engine(target, NgramDrafter(VOCAB, 3)).generate([1] * 250, 10)


def test_token_ids_outside_the_vocabulary_are_refused(target):
    with pytest.raises(DecodeError, match=r"token id 128; expected ids in 0..127"):
        Engine(target).generate([1, 128], 4)


def test_fewer_than_one_proposal_is_refused(target):
    with pytest.raises(DecodeError, match="K=0 proposals per round; expected an integer >= 1"):
        NgramDrafter(VOCAB, proposals=0)
    bad = ReplayDrafter({}, 3)
    bad.proposals = 0
    with pytest.raises(DecodeError, match="proposes K=0 tokens per round"):
        Engine(target, bad)


def test_drafter_with_another_vocabulary_is_refused(target):
    with pytest.raises(DecodeError, match="vocabulary size 4096; expected the target's 128"):
        Engine(target, NgramDrafter(4096, 3))


def test_drafter_returning_the_wrong_shape_is_refused(target):
    class Sloppy(NgramDrafter):
        def propose(self, step):
            return super().propose(step)[:, :2]

    with pytest.raises(DecodeError, match=r"expected a LongTensor of shape \(1, 3\)"):
        Engine(target, Sloppy(VOCAB, 3)).generate([1, 2, 3], 8)


def test_errors_are_value_errors():
    assert issubclass(DecodeError, ValueError)
    warnings.simplefilter("default")
