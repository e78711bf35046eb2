"""Confidence-scheduled verification (`ready.decode.schedule`, `Engine(verify_schedule=...)`).

- The rules against DSpark's reference code as it states them (transcribed here in torch, as the
  references write them): DeepSpec's `_confident_prefix_length`, SGLang #29538's `_confident_prefix`,
  SGLang #30261's `schedule_verify_lens_topk` (verify lengths counting the anchor).
- The engine under the schedule: greedy output equal to AR token for token, one slot and ragged slots
  (one pass of the longest row's width), eager and the graphs' static path, with the DSpark drafter's
  real confidence head and with scripted confidences; each round verifies the drafts the rule keeps;
  ragged rows equal their single-slot generations; a budget caps the batch's verified drafts per round.
"""

from __future__ import annotations

import random

import pytest
import torch

from ready.config import DrafterConfig, ReaderConfig
from ready.decode import DecodeError, DraftStep, Engine
from ready.decode.schedule import (SURVIVAL_EPS, VerifySchedule, budget_drafts, budget_lengths, survivals,
                                   threshold_length)
from ready.drafter import DSparkDrafter
from ready.metrics import tau
from ready.target import HybridLM

from tiny_models import VOCAB, small_target

torch.set_num_threads(1)


# --- the references' rules, as they state them --------------------------------------------------
def deepspec_confident_prefix_length(confidence_logits: torch.Tensor, block_size: int, threshold: float) -> int:
    """DeepSpec deepspec/eval/dspark/draft_ops.py `_confident_prefix_length` (batch 1, logits [1, K])."""
    if threshold <= 0.0:
        return int(block_size)
    below_threshold = confidence_logits.sigmoid() < threshold
    if not bool(below_threshold[0].any().item()):
        return int(block_size)
    return int(torch.nonzero(below_threshold[0], as_tuple=False)[0].item())


def sglang_confident_prefix(confidence_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """SGLang PR #29538 `DSparkWorkerV2._confident_prefix` (logits [B, K]) -> [B]."""
    keep = torch.sigmoid(confidence_logits) >= threshold
    return keep.to(torch.int32).cumprod(dim=1).sum(dim=1)


def sglang_schedule_verify_lens_topk(confidence: torch.Tensor, budget: int, min_verify_len: int = 1,
                                     survival_eps: float = 1e-6) -> torch.Tensor:
    """SGLang PR #30261 `schedule_verify_lens_topk` (confidence probabilities [B, gamma]) -> verify lengths [B],
    the anchor counted (max_len = gamma + 1)."""
    survival = torch.cumprod(confidence.to(torch.float32), dim=1)
    n, gamma = survival.shape
    max_len = gamma + 1
    extra = torch.zeros(n, dtype=torch.int64)
    if budget > 0:
        window = survival[:, :max_len]
        req = torch.arange(n).view(n, 1).expand_as(window).reshape(-1)
        pos = torch.arange(window.shape[1]).view(1, -1).expand_as(window).reshape(-1)
        valid = (window >= survival_eps).reshape(-1)
        prob = torch.where(valid, window.reshape(-1).to(torch.float64), torch.full((window.numel(),), float("-inf"),
                                                                                  dtype=torch.float64))
        order = torch.arange(window.numel())
        order = order[torch.argsort(req[order], stable=True)]
        order = order[torch.argsort(pos[order], stable=True)]
        order = order[torch.argsort(-prob[order], stable=True)]
        chosen = order[:min(int(budget), window.numel())]
        extra.scatter_add_(0, req[chosen], valid[chosen].to(torch.int64))
    lens = torch.full((n,), min_verify_len, dtype=torch.int64) + extra
    return torch.clamp(lens, min=max(min_verify_len, 1), max=max_len)


# exactly representable confidences: products and ties are exact in float32 and in float64
GRID = [0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0]


@pytest.mark.parametrize("threshold", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_threshold_rule_is_deepspec_and_sglang_29538(threshold):
    gen = torch.Generator().manual_seed(3)
    for trial in range(400):
        K = 1 + trial % 7
        if trial % 2:  # ties exactly at the thresholds: c = 0.25, 0.5, 0.75 are sigmoid of exact logits
            c = torch.tensor([[GRID[i] for i in torch.randint(1, len(GRID) - 1, (K,), generator=gen)]])
            logits = torch.log(c / (1 - c))
        else:
            logits = 3 * torch.randn(1, K, generator=gen)
        ours = threshold_length(torch.sigmoid(logits)[0].tolist(), threshold)
        assert ours == deepspec_confident_prefix_length(logits, K, threshold)
        assert ours == int(sglang_confident_prefix(logits, threshold)[0])


def test_budget_rule_is_sglang_30261():
    gen = torch.Generator().manual_seed(5)
    for trial in range(300):
        B, K = 1 + trial % 6, 1 + (trial // 6) % 7
        if trial % 3 == 0:  # many exact ties (between rows and along rows), zeros below SURVIVAL_EPS
            conf = torch.tensor([[GRID[i] for i in torch.randint(0, len(GRID), (K,), generator=gen)] for _ in range(B)])
        else:
            conf = torch.rand(B, K, generator=gen)
        budget = int(torch.randint(0, B * K + 3, (1,), generator=gen))
        ours = budget_lengths(conf.tolist(), [K] * B, budget)
        want = (sglang_schedule_verify_lens_topk(conf, budget) - 1).tolist()  # drafts = verify length - the anchor
        assert ours == want, (conf.tolist(), budget)
        assert sum(ours) <= budget
        for b in range(B):  # the chosen drafts are a prefix of each row: never one whose survival is below eps
            assert all(s >= SURVIVAL_EPS for s in survivals(conf[b].tolist())[:ours[b]])


def test_schedule_combines_threshold_budget_and_room():
    conf = [[0.9, 0.9, 0.9, 0.2], [0.6, 0.6, 0.6, 0.6], None, [0.99, 0.1, 0.9, 0.9]]
    assert VerifySchedule("full").lengths(conf, [4, 4, 0, 2]) == [4, 4, 0, 2]
    assert VerifySchedule("confidence", 0.5).lengths(conf, [4, 4, 0, 2]) == [3, 4, 0, 1]
    assert VerifySchedule("confidence", 0.5).lengths(conf, [2, 4, 0, 4]) == [2, 4, 0, 1]  # the room caps
    # budget of 1.5 drafts per decoding row: round(1.5 * 3) = 4 drafts; survivals .9 .81 .729 | .6 .36 .216 ... | .99
    assert budget_drafts(1.5, 3) == 4
    assert VerifySchedule("confidence", 0.0, 1.5).lengths(conf, [4, 4, 0, 4]) == [3, 0, 0, 1]
    assert VerifySchedule("confidence", 0.5, 1.5).lengths(conf, [4, 4, 0, 4]) == [3, 0, 0, 1]


@pytest.mark.parametrize("kw", [dict(kind="half"), dict(kind="confidence", threshold=1.5),
                                dict(kind="confidence", budget=-1.0)])
def test_a_bad_schedule_is_refused(kw):
    with pytest.raises(DecodeError, match="verify schedule|threshold|budget"):
        VerifySchedule(**kw)


# --- the engine -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target() -> HybridLM:
    return small_target()


def prompts(seed: int = 0, lens=(1, 6, 15, 3, 30, 9)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in lens]


BUDGETS = (20, 7, 25, 1, 13, 18)


class ScoredOracle:
    """A drafter with a scripted confidence head: knows each prompt's AR continuation, drafts it right
    up to a depth drawn per round and wrong after it, and reports step confidences drawn per round too
    (both from the committed tokens, so a ragged row drafts and scores exactly as its single slot)."""

    confidence_head = True  # what the engine asks for; `draft_scored` gives the confidences

    def __init__(self, refs: dict[tuple, list[int]], k: int):
        self.refs, self.proposals, self.vocab_size, self.capture_layers = refs, k, VOCAB, []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def _truth(self, toks: list[int]) -> list[int]:
        for p, cont in self.refs.items():
            if tuple(toks[:len(p)]) == p and toks[len(p):] == cont[:len(toks) - len(p)]:
                return (cont[len(toks) - len(p):] + [0] * self.proposals)[:self.proposals]
        raise AssertionError("the committed tokens left the AR continuation")

    def draft_scored(self, step: DraftStep, sampling=None):
        toks = step.tokens[0].tolist()
        rng = random.Random(hash(tuple(toks)) & 0xFFFF)
        right = rng.randrange(self.proposals + 1)
        truth = self._truth(toks)
        drafts = [t if j < right else (t + 1) % VOCAB for j, t in enumerate(truth)]
        conf = [rng.choice([0.05, 0.3, 0.6, 0.95]) for _ in range(self.proposals)]
        return torch.tensor([drafts]), None, torch.tensor([conf])

    def propose(self, step: DraftStep) -> torch.Tensor:
        return self.draft_scored(step)[0]


def dspark_with_head(target: HybridLM, k: int = 3, reader: bool = False) -> DSparkDrafter:
    """A tiny untrained DSpark drafter whose confidence head is random enough to put confidences on both
    sides of 0.5 (its Markov embedding makes them depend on the drafted tokens)."""
    torch.manual_seed(9)
    d = DSparkDrafter(DrafterConfig(proposals=k, num_layers=2, head_rank=8, confidence_head=True),
                      ReaderConfig(enabled=reader, rank=4, mlp_hidden=16), target).eval()
    with torch.no_grad():
        d.confidence_head.proj.weight.normal_(0.0, 0.15)
        d.confidence_head.proj.bias.zero_()
        d.markov_head.markov_w2.weight.normal_(0.0, 0.5)
    return d


def ar_tokens(target: HybridLM, ps: list[list[int]], budgets) -> list[list[int]]:
    """The AR generations (the lossless reference), one budget per prompt."""
    engine = Engine(target)
    return [engine.generate(p, m).tokens for p, m in zip(ps, budgets)]


def room_of(g, budget: int) -> list[int]:
    """Each round's room: min(K, tokens the budget still allows) before it."""
    out, have = [], 1
    for c in g.committed:
        out.append(min(g.proposals, budget - have))
        have += c
    return out


def check_rounds(gens, budgets, schedule: VerifySchedule) -> list[int]:
    """Every round of a threshold schedule verified exactly the drafts the rule keeps; returns them all."""
    verified = []
    for g, m in zip(gens, budgets):
        assert len(g.verified) == len(g.accepted) == len(g.confidence)
        for n, c, room in zip(g.verified, g.confidence, room_of(g, m)):
            assert n == min(room, threshold_length(c, schedule.threshold))
        assert all(a <= n for a, n in zip(g.accepted, g.verified))
        verified += g.verified
    return verified


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs_static_path"])
def test_scheduled_greedy_equals_ar_one_slot(target, graphs):
    ps = prompts(1)
    ar = ar_tokens(target, ps, [20] * len(ps))
    refs = {tuple(p): a for p, a in zip(ps, ar)}
    schedule = VerifySchedule("confidence", 0.5)
    engine = Engine(target, ScoredOracle(refs, 4), cuda_graphs=graphs, verify_schedule=schedule)
    gens = [engine.generate(p, 20) for p in ps]
    assert [g.tokens for g in gens] == ar
    verified = check_rounds(gens, [20] * len(ps), schedule)
    assert {0, 4} <= set(verified) and len(set(verified)) >= 3  # whole, partial and anchor-only rounds
    full = [Engine(target, ScoredOracle(refs, 4), cuda_graphs=graphs).generate(p, 20) for p in ps]
    assert all(set(g.verified) <= {4, 3, 2, 1} for g in full)  # full verifies what the budget allows
    # the schedule commits no more per round than full does on the same drafts, and so takes more rounds
    assert sum(len(g.accepted) for g in gens) > sum(len(g.accepted) for g in full)


@pytest.mark.parametrize("drafter", ["oracle", "dspark"])
def test_scheduled_tau_counts_unverified_drafts_as_stops(target, drafter):
    """Issue 74 item 5: a round's horizon is the budget's, min(K, tokens left), whatever the schedule verified
    (a draft it did not verify is a stop, not censored), so tau = 1 + sum_j P_j cannot exceed the tokens a
    round verified: tau <= 1 + mean drafts verified per round. (Censoring at the schedule's cut read tau far
    above it: the survival of the rounds the head was sure of.)"""
    ps, budgets = prompts(6, lens=(4, 9, 17, 2, 25, 12)), [24, 30, 19, 27, 22, 26]
    ar = ar_tokens(target, ps, budgets)
    k = 4 if drafter == "oracle" else 3
    d = ScoredOracle({tuple(p): a for p, a in zip(ps, ar)}, k) if drafter == "oracle" else dspark_with_head(target)
    gens = Engine(target, d, batch_size=2, verify_schedule=VerifySchedule("confidence", 0.5)).decode(ps, budgets).generations
    assert [g.tokens for g in gens] == ar
    for g, m in zip(gens, budgets):
        assert g.horizons == room_of(g, m)  # no EOS here: the budget alone censors
    acc = [a for g in gens for a in g.accepted]
    hor = [h for g in gens for h in g.horizons]
    ver = [n for g in gens for n in g.verified]
    assert any(n < h for n, h in zip(ver, hor))  # the schedule did cut rounds short of their horizon
    t = tau(acc, hor, k)
    assert t is not None and t <= 1 + sum(ver) / len(ver)
    assert t <= 1 + sum(acc) / len(acc) + 0.05  # only the budget's last rounds are censored


@pytest.mark.parametrize("batch_size", [2, 4])
def test_scheduled_ragged_rows_equal_their_single_slot_generations(target, batch_size):
    ps = prompts(2)
    ar = ar_tokens(target, ps, [max(BUDGETS)] * len(ps))
    refs = {tuple(p): a for p, a in zip(ps, ar)}
    schedule = VerifySchedule("confidence", 0.5)
    want = [Engine(target, ScoredOracle(refs, 3), verify_schedule=schedule).generate(p, m) for p, m in zip(ps, BUDGETS)]
    engine = Engine(target, ScoredOracle(refs, 3), batch_size=batch_size, verify_schedule=schedule)
    widths = []
    verify = engine.slots.verify
    engine.slots.verify = lambda block, room, scheduled: (widths.append(verify(block, room, scheduled)), widths[-1])[1]
    got = engine.decode(ps, list(BUDGETS)).generations
    for w, g, a, m in zip(want, got, ar, BUDGETS):
        assert (g.tokens, g.accepted, g.horizons, g.committed, g.verified, g.confidence) == \
               (w.tokens, w.accepted, w.horizons, w.committed, w.verified, w.confidence)
        assert g.tokens == a[:m]
    # one pass of the longest scheduled row's width, which varies by round
    assert len({out.logits.shape[1] for out in widths}) > 1


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs_static_path"])
def test_dspark_confidence_head_schedules_a_lossless_decode(target, batch_size, graphs):
    """The real head: the draft step's confidences (eager, the static/graph body, the batched step)
    decide each round's verified drafts, and the output is AR's."""
    ps, budgets = prompts(3), [18, 9, 22, 5, 14, 11]
    ar = ar_tokens(target, ps, budgets)
    drafter = dspark_with_head(target, reader=True)
    drafter.cuda_graphs = graphs
    schedule = VerifySchedule("confidence", 0.5)
    res = Engine(target, drafter, batch_size=batch_size, cuda_graphs=graphs, verify_schedule=schedule).decode(ps, budgets)
    assert [g.tokens for g in res.generations] == ar
    verified = check_rounds(res.generations, budgets, schedule)
    assert 0 in verified and max(verified) == 3
    assert all(0.0 <= c <= 1.0 for g in res.generations for r in g.confidence for c in r)


def test_the_full_schedule_records_the_heads_confidences_too(target):
    drafter = dspark_with_head(target)
    g = Engine(target, drafter).generate(prompts(4)[2], 12)
    assert len(g.confidence) == len(g.accepted) and all(len(c) == 3 for c in g.confidence)
    assert set(g.verified) <= {3, 2, 1}


def test_a_budget_caps_the_batchs_verified_drafts_and_stays_lossless(target):
    ps = prompts(5)
    ar = ar_tokens(target, ps, [16] * len(ps))
    refs = {tuple(p): a for p, a in zip(ps, ar)}
    schedule = VerifySchedule("confidence", 0.0, budget=1.0)
    engine = Engine(target, ScoredOracle(refs, 4), batch_size=4, verify_schedule=schedule)
    lengths = []
    real = schedule.lengths
    object.__setattr__(schedule, "lengths", lambda conf, room: (lengths.append((conf, room, real(conf, room))),
                                                                lengths[-1][2])[1])
    res = engine.decode(ps, 16)
    assert [g.tokens for g in res.generations] == ar
    for conf, room, got in lengths:
        live = sum(c is not None for c in conf)
        assert sum(got) <= budget_drafts(1.0, live)
        assert got == budget_lengths(conf, room, budget_drafts(1.0, live))


def test_a_confidence_schedule_needs_a_confidence_head(target):
    plain = DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, head_rank=8), ReaderConfig(enabled=False), target)
    with pytest.raises(DecodeError, match="confidence head"):
        Engine(target, plain, verify_schedule=VerifySchedule("confidence"))
    Engine(target, None, verify_schedule=VerifySchedule("confidence"))  # AR verifies one token anyway
    Engine(target, plain, verify_schedule=VerifySchedule("confidence"), confidence_fn=lambda b: [1.0] * 3)
