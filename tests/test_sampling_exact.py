"""Speculative sampling is exact in distribution (issue 20), proven two ways on a tiny target with a
4-token vocabulary (float64):

(a) exact: the law of the next N = K + 1 committed tokens under the speculative rule, computed by
    integrating one round over its uniforms cell by cell (each draw is piecewise constant in its
    uniform: the drafter's `sample` is called with the midpoint of every cell of the q it reports,
    `speculative_round` with the midpoint of every accept/reject and residual cell, and each call
    must land in the cell it was aimed at), with the target's verify on a cache for p, rounds chained
    until N tokens are committed; compared with the target's own law (full forwards, no cache) to
    1e-6, for drafters that agree with the target, disagree (the DSpark drafter with a random sequence
    head, a random table), put zero mass where the target has mass, and are deterministic (n-gram).
(b) empirical: many continuations sampled by the engine end to end (drafting, verify, acceptance,
    commit, budget) with fixed seeds, one at a time and 8 at a time through the batched engine; a chi-square goodness-of-fit test per position against the
    target's exact marginals (see CHI2_ALPHA for the false-alarm rate).

Both also run against a planted bug (on rejection, resample from p instead of the residual) and must
catch it: neither test can pass whatever the rule does.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Optional

import numpy as np
import pytest
import torch
from scipy import stats

import ready.decode.sampling as sampling_mod
from ready.config import DrafterConfig, ReaderConfig
from ready.decode import Engine, NgramDrafter
from ready.decode.protocol import DraftStep
from ready.decode.sampling import DraftSampling, SamplingParams, draw, point_mass, speculative_round, warp
from ready.decode.schedule import VerifySchedule
from ready.drafter import DSparkDrafter
from ready.target import HybridConfig, HybridLM

V, K = 4, 2
PROMPT = [1, 3, 0, 2]
EXACT_TOL = 1e-6


@pytest.fixture(scope="module")
def target() -> HybridLM:
    torch.manual_seed(11)
    cfg = HybridConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                       linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=64, eos_token_id=None)
    model = HybridLM(cfg).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # peaked distributions: drafters and target disagree visibly
    return model


def dspark(target: HybridLM) -> DSparkDrafter:
    torch.manual_seed(12)
    d = DSparkDrafter(DrafterConfig(proposals=K, num_layers=1, head_rank=4),
                      ReaderConfig(enabled=True, rank=2, mlp_hidden=8), target).eval()
    with torch.no_grad():  # an untrained head adds nothing; a random one makes q_j depend on the token drawn at j-1
        d.markov_head.markov_w2.weight.normal_(0.0, 3.0)
    return d


class TableDrafter:
    """q_j = table[previous token, j], sampled position by position (a drafter with `sample`)."""

    capture_layers: list[int] = []

    def __init__(self, table: torch.Tensor):
        self.table, self.proposals, self.vocab_size = table, K, V

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def propose(self, step: DraftStep) -> torch.Tensor:
        return self.sample(step, DraftSampling(1.0, 1.0, torch.full((1, K), 0.5)))[0]

    def sample(self, step: DraftStep, sampling: DraftSampling) -> tuple[torch.Tensor, torch.Tensor]:
        prev, toks, qs = step.tokens[0, -1], [], []
        for j in range(K):
            qs.append(self.table[prev, j])
            prev = draw(qs[-1], sampling.uniforms[0, j])
            toks.append(prev)
        return torch.stack(toks)[None], torch.stack(qs)[None]


class AgreeingDrafter(TableDrafter):
    """q_j = the target's own warped distribution after the drafted prefix: every draft is accepted."""

    def __init__(self, target: HybridLM, params: SamplingParams):
        self.target, self.params, self.proposals, self.vocab_size = target, params, K, V

    def sample(self, step: DraftStep, sampling: DraftSampling) -> tuple[torch.Tensor, torch.Tensor]:
        ids, toks, qs = tuple(step.tokens[0].tolist()), [], []
        for j in range(K):
            qs.append(self.q(ids))
            toks.append(int(draw(qs[-1], sampling.uniforms[0, j])))
            ids += (toks[-1],)
        return torch.tensor([toks]), torch.stack(qs)[None]

    @lru_cache(maxsize=None)
    def q(self, ids: tuple) -> torch.Tensor:
        with torch.no_grad():
            logits = self.target(torch.tensor([list(ids)])).logits[0, -1]
        return warp(logits, self.params.temperature, self.params.top_p).float()


def random_table(seed: int, zero_mass: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    table = torch.softmax(2.0 * torch.randn(V, K, V, generator=g), -1)
    if zero_mass:  # q only ever proposes tokens 0 and 1; the target gives every token mass
        table[..., 2:] = 0  # (noqa) tokens 2, 3 never drafted
        table = table / table.sum(-1, keepdim=True)
    return table


def make_drafter(kind: str, target: HybridLM, params: SamplingParams):
    if kind == "agree":
        return AgreeingDrafter(target, params)
    if kind == "dspark":
        return dspark(target)
    if kind == "table":
        return TableDrafter(random_table(1))
    if kind == "zero_mass":
        return TableDrafter(random_table(2, zero_mass=True))
    if kind == "ngram":
        return NgramDrafter(V, K)
    raise ValueError(kind)


# --- the target's own law -----------------------------------------------------------------------
def target_law(target: HybridLM, prefix: list[int], n: int, params: SamplingParams) -> dict[tuple, float]:
    """P(next n tokens) under plain sampling from the target: full forwards, no cache."""
    law = {(): 1.0}
    for _ in range(n):
        seqs = list(law)
        with torch.no_grad():
            logits = target(torch.tensor([prefix + list(s) for s in seqs])).logits[:, -1]
        probs = warp(logits, params.temperature, params.top_p).double()
        law = {s + (x,): law[s] * float(row[x]) for s, row in zip(seqs, probs) for x in range(V) if row[x] > 0}
    return law


# --- the speculative law, integrated over the uniforms ------------------------------------------
def cell_midpoint(row: torch.Tensor, x: int) -> float:
    """The uniform in the middle of token x's cell under `draw` (cumulative mass / total)."""
    cdf = row.cumsum(-1).double()
    lo = float(cdf[x - 1]) if x else 0.0
    return (lo + float(cdf[x])) / 2 / float(cdf[-1])


def share(row: torch.Tensor, x: int) -> float:
    """Token x's share of the row's mass, in float64 (what `draw` gives x)."""
    return float(row[x].double() / row.double().sum())


def draft_cells(drafter, step: DraftStep, params: SamplingParams):
    """Every draft block the drafter can produce, with its probability and the q it reports: the
    drafter is called at the midpoint of every cell of its own q_j, position by position, and must
    draw the token of that cell."""
    if not hasattr(drafter, "sample"):
        drafts = drafter.propose(step)[0]
        yield drafts.tolist(), 1.0, point_mass(drafts, V)
        return

    def visit(chosen: list[int], us: list[float], weight: float):
        u = torch.tensor([us + [0.5] * (K - len(us))], dtype=torch.float32)
        toks, q = drafter.sample(step, DraftSampling(params.temperature, params.top_p, u))
        assert toks[0, : len(chosen)].tolist() == chosen, "the drafter drew outside the cell of the q it reported"
        if len(us) == K:
            yield chosen, weight, q[0]
            return
        row = q[0, len(us)]
        for x in range(V):
            if row[x] > 0:
                yield from visit(chosen + [x], us + [cell_midpoint(row, x)], weight * share(row, x))

    yield from visit([], [], 1.0)


def round_outcomes(target: HybridLM, drafter, prefix: tuple, params: SamplingParams) -> list[tuple[tuple, float]]:
    """(committed tokens, probability) of every outcome of one round after `prefix`."""
    capture = list(getattr(drafter, "capture_layers", []))
    cache = target.new_cache(batch_size=1, max_len=len(prefix) + K + 1, max_verify=K + 1)
    with torch.no_grad():
        pre = target.prefill(torch.tensor([list(prefix[:-1])]), cache, capture_layers=capture)
    drafter.begin(torch.tensor([list(prefix)]))
    step = DraftStep(tokens=torch.tensor([list(prefix)]), features=pre.hidden if capture else None,
                     target=target, cache=cache)
    out = []
    for drafts, w_draft, q in draft_cells(drafter, step, params):
        with torch.no_grad():
            logits = target.verify(torch.tensor([[prefix[-1], *drafts]]), cache, capture_layers=capture).logits[0]
        cache.pending = 0  # nothing committed: the next block is verified after the same prefix
        p = warp(logits, params.temperature, params.top_p)
        accept, residual = sampling_mod.accept_law(p[:K], q)  # looked up per call: the planted-bug test swaps it
        a = [float(accept[j, d]) for j, d in enumerate(drafts)]
        for m in range(K + 1):  # m drafts accepted, then a rejection (m < K) or the bonus (m = K)
            w_m = float(np.prod(a[:m])) * ((1.0 - a[m]) if m < K else 1.0)
            if w_m <= 0:
                continue
            u_acc = [a[j] / 2 for j in range(m)] + ([(1.0 + a[m]) / 2] if m < K else [])
            u_acc += [0.5] * (K - len(u_acc))
            row = residual[m] if m < K else p[K]
            for x in range(V):
                if row[x] <= 0:
                    continue
                n_acc, nxt = speculative_round(p, q, torch.tensor(drafts), torch.tensor(u_acc, dtype=torch.float64),
                                               torch.tensor(cell_midpoint(row, x), dtype=torch.float64))
                assert (int(n_acc), int(nxt)) == (m, x), "speculative_round left the cell it was aimed at"
                out.append((tuple(drafts[:m]) + (x,), w_draft * w_m * share(row, x)))
    return out


def scheduled_round_outcomes(target: HybridLM, drafter, prefix: tuple, params: SamplingParams,
                             verified) -> list[tuple[tuple, float]]:
    """`round_outcomes` under a verify schedule: `verified(drafts, confidences)` -> L, the drafts the round
    verifies (0..K); the block [anchor, first L drafts] is verified and judged by the engine's batched rule
    (`speculative_rounds` with n = L, the target rows past L padded as the engine pads them)."""
    capture = list(getattr(drafter, "capture_layers", []))
    cache = target.new_cache(batch_size=1, max_len=len(prefix) + K + 1, max_verify=K + 1)
    with torch.no_grad():
        pre = target.prefill(torch.tensor([list(prefix[:-1])]), cache, capture_layers=capture)
    drafter.begin(torch.tensor([list(prefix)]))
    step = DraftStep(tokens=torch.tensor([list(prefix)]), features=pre.hidden if capture else None,
                     target=target, cache=cache)
    out = []

    def visit(chosen: list[int], us: list[float], weight: float):
        u = torch.tensor([us + [0.5] * (K - len(us))], dtype=torch.float32)
        toks, q, conf = drafter.draft_scored(step, DraftSampling(params.temperature, params.top_p, u))
        assert toks[0, : len(chosen)].tolist() == chosen
        if len(us) == K:
            yield chosen, weight, q[0], conf[0].tolist()
            return
        row = q[0, len(us)]
        for x in range(V):
            if row[x] > 0:
                yield from visit(chosen + [x], us + [cell_midpoint(row, x)], weight * share(row, x))

    for drafts, w_draft, q, conf in visit([], [], 1.0):
        n = int(verified(drafts, conf))
        with torch.no_grad():
            logits = target.verify(torch.tensor([[prefix[-1], *drafts[:n]]]), cache, capture_layers=capture).logits[0]
        cache.pending = 0
        p = warp(logits, params.temperature, params.top_p)
        p_pad = torch.cat([p, p[-1:].expand(K + 1 - p.shape[0], -1)]) if p.shape[0] < K + 1 else p
        accept, residual = sampling_mod.accept_law(p_pad[:K], q)
        a = [float(accept[j, d]) for j, d in enumerate(drafts[:n])]
        for m in range(n + 1):  # m verified drafts accepted, then a rejection (m < n) or the bonus from p[n]
            w_m = float(np.prod(a[:m])) * ((1.0 - a[m]) if m < n else 1.0)
            if w_m <= 0:
                continue
            u_acc = [a[j] / 2 for j in range(m)] + ([(1.0 + a[m]) / 2] if m < n else [])
            u_acc += [0.5] * (K - len(u_acc))
            row = residual[m] if m < n else p_pad[n]
            for x in range(V):
                if row[x] <= 0:
                    continue
                n_acc, nxt = sampling_mod.speculative_rounds(
                    p_pad[None], q[None], torch.tensor([drafts]), torch.tensor([u_acc], dtype=torch.float64),
                    torch.tensor([cell_midpoint(row, x)], dtype=torch.float64), torch.tensor([n]))
                assert (int(n_acc[0]), int(nxt[0])) == (m, x), "speculative_rounds left the cell it was aimed at"
                out.append((tuple(drafts[:m]) + (x,), w_draft * w_m * share(row, x)))
    return out


def speculative_law(target: HybridLM, drafter, prefix: list[int], n: int, params: SamplingParams,
                    verified=None) -> dict[tuple, float]:
    """P(next n committed tokens) under speculative sampling, rounds chained until n are committed;
    `verified` (a verify schedule, `scheduled_round_outcomes`): each round verifies only what it keeps."""

    def outcomes(pre: tuple) -> list[tuple[tuple, float]]:
        if verified is None:
            return round_outcomes(target, drafter, pre, params)
        return scheduled_round_outcomes(target, drafter, pre, params, verified)

    @lru_cache(maxsize=None)
    def law(pre: tuple, need: int) -> dict[tuple, float]:
        acc: dict[tuple, float] = defaultdict(float)
        for toks, w in outcomes(pre):
            if len(toks) >= need:
                acc[toks[:need]] += w
            else:
                for rest, w2 in law(pre + toks, need - len(toks)).items():
                    acc[toks + rest] += w * w2
        return dict(acc)

    return law(tuple(prefix), n)


def max_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


EXACT_ACCEPT_LAW = sampling_mod.accept_law


def _resample_from_p(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The classic bug: after a rejection, draw from p instead of the residual (double-counts accepted mass)."""
    accept, _ = EXACT_ACCEPT_LAW(p, q)
    return accept, p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize("kind,temperature,top_p", [
    ("agree", 1.0, 1.0), ("dspark", 1.0, 1.0), ("table", 1.0, 1.0), ("zero_mass", 1.0, 1.0), ("ngram", 1.0, 1.0),
    ("dspark", 0.7, 0.8),  # top-p: the target has zero mass where the drafter has some
])
def test_speculative_law_equals_the_target_law_exactly(target, kind, temperature, top_p):
    params = SamplingParams(temperature, top_p)
    prefix = PROMPT + [3]  # the prompt and the first new token (drawn from the prefill alone)
    want = target_law(target, prefix, K + 1, params)
    got = speculative_law(target, make_drafter(kind, target, params), prefix, K + 1, params)
    assert abs(sum(got.values()) - 1.0) < 1e-9
    assert max_gap(got, want) < EXACT_TOL
    if kind == "zero_mass":  # the drafter never proposes 2 or 3, yet the output reaches them
        assert sum(w for s, w in got.items() if s[0] >= 2) > 0.05


def dspark_scored(target: HybridLM) -> DSparkDrafter:
    """The DSpark drafter with a random confidence head: its step confidences fall on both sides of 0.5 and
    depend on the token drawn before each position (its Markov embedding)."""
    torch.manual_seed(13)
    d = DSparkDrafter(DrafterConfig(proposals=K, num_layers=1, head_rank=4, confidence_head=True),
                      ReaderConfig(enabled=True, rank=2, mlp_hidden=8), target).eval()
    with torch.no_grad():
        d.markov_head.markov_w2.weight.normal_(0.0, 3.0)
        d.confidence_head.proj.weight.normal_(0.0, 2.0)
        d.confidence_head.proj.bias.zero_()
    return d


SCHEDULES = {"threshold": VerifySchedule("confidence", 0.5), "budget": VerifySchedule("confidence", 0.0, budget=1.0)}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_scheduled_speculative_law_equals_the_target_law_exactly(target, schedule):
    """Each round verifies the drafts the confidence schedule keeps (0, 1 or 2 here, depending on the
    drafted tokens through the head's Markov input): the law of the committed tokens is still the target's."""
    params = SamplingParams(1.0, 1.0)
    prefix = PROMPT + [3]
    seen: set[int] = set()

    def verified(drafts: list[int], conf: list[float]) -> int:
        if schedule == "threshold":
            n = SCHEDULES[schedule].lengths([conf], [K])[0]
        else:  # a batch budget of 1.5 drafts per row shared with another row: its survivals .7, .28 compete
            n = VerifySchedule("confidence", 0.0, budget=1.5).lengths([conf, [0.7, 0.4]], [K, K])[0]
        seen.add(n)
        return n

    want = target_law(target, prefix, K + 1, params)
    got = speculative_law(target, dspark_scored(target), prefix, K + 1, params, verified)
    assert abs(sum(got.values()) - 1.0) < 1e-9
    assert max_gap(got, want) < EXACT_TOL
    assert len(seen) >= 2  # the schedule really varied what a round verified


def test_the_exact_check_catches_a_schedule_that_reads_the_draft_it_decides(target):
    """A schedule that verifies draft 1 only when draft 1 is token 0 (not a stopping time: it reads the very
    draft it decides on) biases the committed tokens; the exact law sees it."""
    params = SamplingParams(1.0, 1.0)
    prefix = PROMPT + [3]
    want = target_law(target, prefix, K + 1, params)
    got = speculative_law(target, dspark_scored(target), prefix, K + 1, params,
                          lambda drafts, conf: K if drafts[0] == 0 else 0)
    assert max_gap(got, want) > 1e-3


def test_the_exact_check_catches_resampling_from_p(target, monkeypatch):
    params = SamplingParams(1.0, 1.0)
    prefix = PROMPT + [3]
    want = target_law(target, prefix, K + 1, params)
    monkeypatch.setattr(sampling_mod, "accept_law", _resample_from_p)
    got = speculative_law(target, make_drafter("table", target, params), prefix, K + 1, params)
    assert max_gap(got, want) > 1e-2


# --- (b) empirical: chi-square per position ------------------------------------------------------
# False-alarm rate: the test rejects when any of the L positions' statistics exceeds the (1 - CHI2_ALPHA / L)
# quantile of chi-square with (bins - 1) degrees of freedom (bins with an expected count < 5 pooled into one).
# By Bonferroni, a correct sampler fails with probability at most CHI2_ALPHA = 0.1 % for a fresh set of seeds;
# the seeds here are fixed (0 .. N_SAMPLES - 1), so the outcome is reproducible.
CHI2_ALPHA = 1e-3
N_SAMPLES = 600  # the planted bug below is rejected at p ~ 1e-6 with this many
L = 3  # new tokens compared (the first comes from the prefill, the next from speculative rounds)


def marginals(law: dict[tuple, float], length: int) -> np.ndarray:
    out = np.zeros((length, V))
    for seq, w in law.items():
        for i, x in enumerate(seq):
            out[i, x] += w
    return out


def chi2_rejects(counts: np.ndarray, expected_p: np.ndarray, n: int) -> tuple[bool, list[float]]:
    """Per position: pooled chi-square statistic; True when any exceeds its Bonferroni threshold."""
    pvalues, reject = [], False
    for c, p in zip(counts, expected_p):
        e = p * n
        small = e < 5
        obs = np.append(c[~small], c[small].sum()) if small.any() else c
        exp = np.append(e[~small], e[small].sum()) if small.any() else e
        keep = exp > 0
        obs, exp = obs[keep], exp[keep]
        stat = float(((obs - exp) ** 2 / exp).sum())
        pval = float(stats.chi2.sf(stat, len(obs) - 1))
        pvalues.append(pval)
        reject |= pval < CHI2_ALPHA / len(counts)
    return reject, pvalues


def sampled_counts(target: HybridLM, drafter, params: SamplingParams, batch: int = 0,
                   schedule: Optional[VerifySchedule] = None) -> np.ndarray:
    """Token counts per position over N_SAMPLES generations (seeds 0 ..): one at a time through `Engine`,
    or `batch` at a time through the batched engine (ragged rows: each row's acceptance is its own);
    `schedule`: the engine's verify schedule."""
    if batch:
        res = Engine(target, drafter, batch_size=batch, sampling=params, slots="ragged", verify_schedule=schedule).decode(
            [PROMPT] * N_SAMPLES, L, seeds=list(range(N_SAMPLES)))
        generations = [g.tokens for g in res.generations]
    else:
        engine = Engine(target, drafter, sampling=params, verify_schedule=schedule)
        generations = [engine.generate(PROMPT, L, seed=seed).tokens for seed in range(N_SAMPLES)]
    counts = np.zeros((L, V))
    for toks in generations:
        assert len(toks) == L
        for i, x in enumerate(toks):
            counts[i, x] += 1
    return counts


@pytest.fixture(scope="module")
def exact_marginals(target):
    params = SamplingParams(1.0, 1.0)
    return marginals(target_law(target, PROMPT, L, params), L)


@pytest.mark.parametrize("kind", ["ar", "dspark", "ngram"])
def test_sampled_tokens_pass_chi_square_per_position(target, exact_marginals, kind):
    params = SamplingParams(1.0, 1.0)
    drafter = None if kind == "ar" else make_drafter(kind, target, params)
    if kind == "dspark":
        drafter.cuda_graphs = True  # the static draft step (the CUDA graph's body; eager on CPU)
    reject, pvalues = chi2_rejects(sampled_counts(target, drafter, params), exact_marginals, N_SAMPLES)
    assert not reject, f"per-position p-values {pvalues} (threshold {CHI2_ALPHA / L:.2g})"


@pytest.mark.parametrize("kind", ["dspark", "table"])
def test_batched_sampled_tokens_pass_chi_square_per_position(target, exact_marginals, kind):
    """The same law through the batched engine, 8 rows at a time (the DSpark drafter's batched draft step)."""
    params = SamplingParams(1.0, 1.0)
    counts = sampled_counts(target, make_drafter(kind, target, params), params, batch=8)
    reject, pvalues = chi2_rejects(counts, exact_marginals, N_SAMPLES)
    assert not reject, f"per-position p-values {pvalues} (threshold {CHI2_ALPHA / L:.2g})"


@pytest.mark.parametrize("batch,schedule", [(0, "threshold"), (8, "threshold"), (8, "budget")])
def test_scheduled_sampled_tokens_pass_chi_square_per_position(target, exact_marginals, batch, schedule):
    """End to end under a confidence schedule: one slot, and 8 ragged rows verifying their own lengths in one
    pass (the threshold), or sharing a budget of one draft per row (rows decide each other's lengths)."""
    params = SamplingParams(1.0, 1.0)
    drafter = dspark_scored(target)
    counts = sampled_counts(target, drafter, params, batch, SCHEDULES[schedule])
    reject, pvalues = chi2_rejects(counts, exact_marginals, N_SAMPLES)
    assert not reject, f"per-position p-values {pvalues} (threshold {CHI2_ALPHA / L:.2g})"


@pytest.mark.parametrize("batch", [0, 8])
def test_chi_square_catches_resampling_from_p(target, exact_marginals, monkeypatch, batch):
    params = SamplingParams(1.0, 1.0)
    monkeypatch.setattr(sampling_mod, "accept_law", _resample_from_p)
    reject, pvalues = chi2_rejects(sampled_counts(target, make_drafter("table", target, params), params, batch),
                                   exact_marginals, N_SAMPLES)
    assert reject, f"the planted bug went unnoticed: p-values {pvalues}"
