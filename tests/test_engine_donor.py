"""The state placebo's donor path: the drafter reads another sequence's committed states,
position for position, while the output stays the target's own greedy tokens."""

from __future__ import annotations

import pytest
import torch

from ready.decode import Engine, evaluate
from ready.decode.errors import DecodeError
from ready.decode.evaluate import next_prompt_donors
from ready.target import HybridConfig, HybridLM

torch.set_num_threads(1)
VOCAB = 64


@pytest.fixture(scope="module")
def target() -> HybridLM:
    torch.manual_seed(11)
    cfg = HybridConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                       max_position_embeddings=128)
    return HybridLM(cfg).eval()


class StateSpy:
    """A drafter that records what the reader would read (cache length and GDN states) each round
    and drafts the last token repeated (so some drafts are accepted on repetitive text)."""

    proposals, vocab_size, capture_layers = 3, VOCAB, []

    def __init__(self) -> None:
        self.seen: list[tuple[int, torch.Tensor]] = []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.seen = []

    def propose(self, step) -> torch.Tensor:
        self.seen.append((step.cache.length, step.cache.ssm.clone()))
        return step.tokens[:, -1:].repeat(1, self.proposals)


def states_after(target: HybridLM, ids: list[int]) -> torch.Tensor:
    cache = target.new_cache(1, max_len=128)
    target.prefill(torch.tensor([ids]), cache)
    return cache.ssm.clone()


def test_the_reader_sees_the_donors_states_at_its_own_position_and_the_output_is_unchanged(target):
    prompt, other = [1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8]
    own_spy, donor_spy = StateSpy(), StateSpy()
    own = Engine(target, own_spy).generate(prompt, 20)
    ar_other = Engine(target).generate(other, 20)
    donor = other + ar_other.tokens
    placebo = Engine(target, donor_spy).generate(prompt, 20, donor=donor)

    assert placebo.tokens == own.tokens == Engine(target).generate(prompt, 20).tokens  # verification is the target's
    assert [n for n, _ in donor_spy.seen] == [n for n, _ in own_spy.seen]  # same rounds read ...
    for n, ssm in donor_spy.seen:  # ... the donor's states after as many tokens as this row committed
        torch.testing.assert_close(ssm, states_after(target, donor[:n]), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(ssm, states_after(target, (prompt + own.tokens)[:n]))


def test_a_donor_that_is_the_sequence_itself_changes_nothing(target):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    own_spy, self_spy = StateSpy(), StateSpy()
    own = Engine(target, own_spy).generate(prompt, 16)
    again = Engine(target, self_spy).generate(prompt, 16, donor=prompt + own.tokens)
    assert again.accepted == own.accepted and again.committed == own.committed
    for (n1, s1), (n2, s2) in zip(own_spy.seen, self_spy.seen):
        assert n1 == n2
        torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)


def test_a_donor_shorter_than_the_sequence_stops_at_its_last_state(target):
    spy = StateSpy()
    Engine(target, spy).generate([1, 2, 3, 4, 5, 6, 7, 8], 12, donor=[5, 4, 3])
    final = states_after(target, [5, 4, 3])
    for _, ssm in spy.seen:
        torch.testing.assert_close(ssm, final, rtol=1e-5, atol=1e-5)


def test_evaluate_pairs_each_prompt_with_the_next_ones_states_and_records_it(target):
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    res = evaluate(target, StateSpy(), prompts, 10, warmup=0, progress=False, donors=next_prompt_donors(3))
    assert res.lossless == 1
    assert [p.donor for p in res.prompts] == [1, 2, 0]
    assert all(sum(p.committed) == len(p.tokens) - 1 for p in res.prompts)


def test_evaluate_on_donor_states_through_slots_equals_one_prompt_at_a_time(target):
    """The state swap's setting: evaluate(donors=..., concurrency=c) decodes through the batched engine,
    every prompt with its own donor, and records what one prompt at a time records."""
    from ready.config import DrafterConfig, ReaderConfig
    from ready.drafter import DSparkDrafter

    torch.manual_seed(3)
    drafter = DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, head_rank=8),
                            ReaderConfig(enabled=True, rank=4, mlp_hidden=16), target).eval()
    for r in drafter.readers.values():
        torch.nn.init.normal_(r.fuse_out.weight, std=0.5)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 1, 13, 1, 13]]
    one = evaluate(target, drafter, prompts, 12, warmup=0, progress=False, donors=next_prompt_donors(4))
    slots = evaluate(target, drafter, prompts, 12, warmup=1, progress=False, donors=next_prompt_donors(4),
                     concurrency=3)
    assert slots.concurrency == 3 and slots.lossless == 1
    assert [(p.donor, p.tokens, p.accepted, p.committed) for p in slots.prompts] == \
        [(p.donor, p.tokens, p.accepted, p.committed) for p in one.prompts]


def test_a_placebo_needs_two_prompts_and_a_drafter(target):
    with pytest.raises(DecodeError, match="at least 2 prompts"):
        next_prompt_donors(1)
    with pytest.raises(DecodeError, match="drafter"):
        Engine(target).generate([1, 2], 4, donor=[3, 4])


class Oracle:
    """Drafts the target's own greedy continuation (every draft is accepted)."""

    proposals, vocab_size, capture_layers = 3, VOCAB, []

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.full = prompt + continuation

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def propose(self, step) -> torch.Tensor:
        t = step.tokens.shape[1]
        nxt = (self.full[t:t + self.proposals] + [0] * self.proposals)[: self.proposals]
        return torch.tensor([nxt])


def test_a_round_the_budget_cuts_counts_its_observed_drafts_not_its_missing_bonus(target):
    prompt = [1, 2, 3, 4]
    ar = Engine(target).generate(prompt, 20).tokens
    gen = Engine(target, Oracle(prompt, ar)).generate(prompt, 4)  # prefill gives 1, the round may add 3
    assert gen.accepted == [3] and gen.horizons == [3] and gen.committed == [3]  # no room for the bonus
    res = evaluate(target, Oracle(prompt, ar), [prompt], 4, warmup=0, progress=False)
    assert res.metrics.tau == 4.0  # 1 + P_1 + P_2 + P_3 (ready.metrics): the budget, not the drafter, lost a token


def test_interleaved_ar_times_each_prompt_beside_the_drafter_instead_of_reusing_stored_timings(target):
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    stored = [Engine(target).generate(p, 10) for p in prompts]
    for g in stored:
        g.wall_s = 999.0  # a timing from another process, another day
    spy = StateSpy()
    old = evaluate(target, spy, prompts, 10, warmup=0, progress=False, ar=stored)
    new = evaluate(target, spy, prompts, 10, warmup=0, progress=False, ar=stored, interleave_ar=True)
    assert [p.ar_wall_s for p in old.prompts] == [999.0] * 3
    assert all(0 < p.ar_wall_s < 999.0 for p in new.prompts) and new.lossless == 1
    assert new.ar.tps > old.ar.tps and new.metrics.speedup < old.metrics.speedup
