"""Batched decoding (`ready.decode.engine` with ragged slots): B sequences per target forward, each row at its own length,
with its own acceptance, budget and EOS, gives every row exactly its batch-1 generation (tokens, and
also accepted lengths, horizons and committed counts, which show the batched drafts are the batch-1
drafts). Float32 on CPU; the CUDA tests replay the captured graphs."""

from __future__ import annotations

import copy
import random
from collections import Counter

import pytest
import torch

from ready.config import DrafterConfig, ReaderConfig
from ready.decode import DecodeError, Engine, NgramDrafter
from ready.decode import generate_batch
from ready.decode.sampling import SamplingParams
from ready.decode.schedule import VerifySchedule
from ready.target import HybridLM

from tiny_models import VOCAB, small_target

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
drafter_mod = pytest.importorskip("ready.drafter")
PROMPT_LENS = (1, 6, 15, 3, 30, 9)
BUDGETS = (20, 7, 25, 1, 13, 18)  # rows finish at different rounds; one ends at the prefill


@pytest.fixture(scope="module")
def target() -> HybridLM:
    return small_target()


def make_drafter(target: HybridLM, kind: str, k: int = 3):
    """None (AR), the n-gram drafter, or a small untrained DSpark drafter; ReaDy's reader gets a
    non-zero output projection so its drafts really depend on the states it reads. "ready_embed":
    ReaDy over a context of the token embeddings and a layer output (capture id -1, the positive control's)."""
    if kind == "ar":
        return None
    if kind == "ngram":
        return NgramDrafter(VOCAB, k)
    torch.manual_seed(6)
    ctx = {"context_layers": [-1, 33]} if kind == "ready_embed" else {}
    d = drafter_mod.DSparkDrafter(DrafterConfig(proposals=k, num_layers=2, head_rank=8, **ctx),
                                  ReaderConfig(enabled=kind.startswith("ready"), rank=4, mlp_hidden=16), target).eval()
    for r in d.readers.values():
        torch.nn.init.normal_(r.fuse_out.weight, std=0.5)
    return d


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(n)] for n in PROMPT_LENS]


def content_accept(drafted: torch.Tensor, argmax: torch.Tensor) -> int:
    """A forced acceptance rule that depends only on the round's content: the batch-1 engine and the
    batched one draw the same A wherever their drafts and argmaxes agree, and A varies over 0..n."""
    return int((int(drafted.sum()) * 31 + int(argmax[0])) % (drafted.numel() + 1))


def fields(g) -> tuple:
    return g.prompt_len, g.tokens, g.accepted, g.horizons, g.committed, g.stop


def check_equal(target, drafter, batch_size, ps, budgets, **kw) -> list:
    want = [Engine(target, drafter, **kw).generate(p, m) for p, m in zip(ps, budgets)]
    res = Engine(target, drafter, batch_size=batch_size, **kw, slots="ragged").decode(ps, list(budgets))
    got = res.generations
    assert len(got) == len(want)
    for i, (w, g) in enumerate(zip(want, got)):
        assert fields(g) == fields(w), f"prompt {i} (batch {batch_size})"
    # every span of the clock is charged to the generations it served: TPS at concurrency B is
    # total tokens / wall time, and each generation's share is positive
    assert sum(g.wall_s for g in got) == pytest.approx(res.wall_s, rel=1e-6)
    assert res.tokens_per_s == pytest.approx(sum(len(g.tokens) for g in got) / res.wall_s)
    assert all(g.wall_s > 0 for g in got)
    return want


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("kind", ["ar", "ngram", "dspark", "ready"])
def test_batched_greedy_equals_batch_one(target, kind, batch_size):
    """Six prompts of different lengths and budgets through 1 or 4 slots (slots are refilled as rows end)."""
    drafter = make_drafter(target, kind)
    want = check_equal(target, drafter, batch_size, prompts(), BUDGETS)
    if kind == "ngram":  # prompt lookup does get drafts accepted here: ragged commits
        assert any(a > 0 for g in want for a in g.accepted)


@pytest.mark.parametrize("kind", ["ar", "dspark", "ready"])
def test_prompts_admitted_together_in_padded_passes_decode_as_batch_one(target, kind, monkeypatch):
    """The admission as on CUDA (`admit_tokens`: several prompts per right-padded prefill, refills of rows
    that end in the same round together): the same generations, features and all (float32)."""
    from ready.decode import slots

    passes: list[list[int]] = []
    grouping = slots.admission_passes
    monkeypatch.setattr(slots, "admission_passes", lambda n, *a: (passes.append(list(n)), grouping(n, *a))[1])
    check_equal(target, make_drafter(target, kind), 4, prompts(), BUDGETS, admit_tokens=64)
    assert passes[0] == [1, 6, 15, 3]  # the first four prompts in one call; 64 tokens: [15, 6, 3, 1] in one pass
    assert grouping([1, 6, 15, 3], 64) == [[2, 1, 3, 0]]


def test_a_target_that_prefills_in_pieces_admits_its_longer_prompts_one_at_a_time(target, monkeypatch):
    monkeypatch.setattr(target, "prefill_chunk", 8)  # prompts of 15 and 30 tokens prefill in pieces, alone
    check_equal(target, make_drafter(target, "ready"), 4, prompts(), BUDGETS, admit_tokens=64)


def test_admission_passes_keep_like_lengths_together_within_the_budget():
    from ready.decode.slots import admission_passes

    assert admission_passes([30, 1, 9, 30, 80], 64) == [[4], [0, 3], [2, 1]]  # 80 > 64 passes alone
    assert admission_passes([5, 6], 0) == [[0], [1]]
    # a target that prefills in pieces of 20 tokens: a longer prompt is prefilled alone, in pieces
    assert admission_passes([30, 1, 9, 30, 8], 64, alone_above=20) == [[0], [3], [2, 4, 1]]


def test_the_greedy_ar_round_commits_before_the_host_reads_its_tokens(target, monkeypatch):
    """As with one slot (tests/test_engine.py): each batched AR round's commit is queued right behind its
    pass, before the device->host read of the rows' tokens, and the rows' tokens are batch one's."""
    from ready.decode import slots

    want = [Engine(target).generate(p, m) for p, m in zip(prompts(), BUDGETS)]
    events: list[str] = []
    commit, tolist = slots.ragged_commit, torch.Tensor.tolist
    monkeypatch.setattr(slots, "ragged_commit", lambda *a, **k: (events.append("commit"), commit(*a, **k))[1])
    monkeypatch.setattr(torch.Tensor, "tolist",  # a round's read is [B, 1]; a prompt's is one row
                        lambda t: (events.append("read") if t.dim() == 2 else None, tolist(t))[1])
    res = Engine(target, batch_size=4, slots="ragged").decode(prompts(), list(BUDGETS))
    assert [fields(g) for g in res.generations] == [fields(g) for g in want]
    assert events == ["commit", "read"] * res.rounds


@pytest.mark.parametrize("batch_size", [2, 4, 8])
@pytest.mark.parametrize("kind", ["dspark", "ready", "ready_embed"])
def test_ragged_forced_acceptance_equals_batch_one(target, kind, batch_size):
    """Every round accepts 0..K drafts per row (a content rule, the same in both engines), so rows grow
    by different amounts each round: the batched drafter's per-row context, positions and reader slot,
    and the per-row commit, must follow each row exactly (8 slots: more slots than prompts)."""
    drafter = make_drafter(target, kind)
    want = check_equal(target, drafter, batch_size, prompts(1), BUDGETS, accept_fn=content_accept)
    accepted = {a for g in want for a in g.accepted}
    assert accepted == {0, 1, 2, 3}


def test_ragged_draft_step_through_split_key_attention_equals_batch_one(target, monkeypatch):
    """Where the split-key kernel serves the draft block (16-bit CUDA), the batched step writes each row's
    block after its own context and reads keys < n[b] + N; the kernel's reference stands in here."""
    import importlib

    import ready.drafter.model as drafter_model

    reference = importlib.import_module("ready_kernels.decode_attention").decode_attention_reference
    monkeypatch.setattr(drafter_model, "split_kv_attention", lambda *a: reference)
    check_equal(target, make_drafter(target, "ready"), 4, prompts(1), BUDGETS, accept_fn=content_accept)


SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, seed=0)
SEEDS = [11, 12, 13, 14, 15, 16]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("kind", ["ar", "ngram", "dspark", "ready"])
def test_batched_sampling_draws_what_batch_one_draws_with_the_same_seeds(target, kind, batch_size):
    """Temperature 1, top-p 0.9, a seed per prompt: every row draws its own uniforms in Engine's order, so
    each generation (tokens, accepted lengths, horizons) and its traced rounds equal the batch-1 engine's."""
    drafter = make_drafter(target, kind)
    ps = prompts(2)
    single = Engine(target, drafter, sampling=SAMPLED)
    want, want_traces = [], []
    for p, m, seed in zip(ps, BUDGETS, SEEDS):
        want.append(single.generate(p, m, seed=seed, trace_rounds=2))
        want_traces.append([(t.start, t.drafts, t.accepted) for t in single.traces])
    res = Engine(target, drafter, batch_size=batch_size, sampling=SAMPLED, slots="ragged").decode(
        ps, list(BUDGETS), seeds=SEEDS, trace_rounds=2)
    for i, (w, g) in enumerate(zip(want, res.generations)):
        assert fields(g) == fields(w), f"prompt {i} (batch {batch_size})"
    assert [[(t.start, t.drafts, t.accepted) for t in tr] for tr in res.traces] == want_traces
    greedy = Engine(target, drafter, batch_size=batch_size, slots="ragged").decode(ps, list(BUDGETS))
    assert [g.tokens for g in greedy.generations] != [g.tokens for g in res.generations]
    if kind != "ar":  # the rule does reject drafts here, so rows commit raggedly
        assert any(t[2] < len(t[1]) for tr in want_traces for t in tr)


@pytest.mark.parametrize("kind", ["ar", "ready"])
def test_sampled_rows_that_draw_the_eos_end_where_batch_one_ends(target, kind):
    """The EOS is a token the sampled generations do draw mid-way: each row stops at it (or at its budget)
    exactly where its batch-1 sampled generation stops, and the slot is refilled."""
    drafter = make_drafter(target, kind)
    ps, seeds = prompts(5), list(range(100, 106))
    free = [Engine(target, drafter, sampling=SAMPLED).generate(p, 30, seed=s) for p, s in zip(ps, seeds)]
    eos = Counter(x for g in free for x in g.tokens[3:]).most_common(1)[0][0]
    want = [Engine(target, drafter, sampling=SAMPLED, eos_token_id=eos).generate(p, 30, seed=s) for p, s in zip(ps, seeds)]
    got = Engine(target, drafter, batch_size=3, sampling=SAMPLED, eos_token_id=eos, slots="ragged").decode(
        ps, 30, seeds=seeds).generations
    assert [fields(g) for g in got] == [fields(w) for w in want]
    assert {g.stop for g in got} == {"eos", "budget"}


def test_on_finish_gets_each_generation_with_its_traces_as_it_ends_and_off_the_clock(target, monkeypatch):
    """A distribution check can run while the batch goes on: `on_finish(i, generation, traces)` is called
    once per prompt as its generation ends (traces then not kept), and its time is not on the clock (the
    engine's clock is made to jump 1,000 s inside each call)."""
    import time
    from types import SimpleNamespace

    import ready.decode.engine as engine_mod

    drafter = make_drafter(target, "ready")
    ps = prompts(2)
    engine = Engine(target, drafter, batch_size=3, sampling=SAMPLED, slots="ragged")
    kept = engine.decode(ps, list(BUDGETS), seeds=SEEDS, trace_rounds=2)
    jump = [0.0]
    monkeypatch.setattr(engine_mod, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + jump[0]))
    seen = {}

    def check(i, g, traces):
        seen[i] = (list(g.tokens), [(t.start, t.drafts, t.accepted) for t in traces])
        jump[0] += 1000.0

    res = engine.decode(ps, list(BUDGETS), seeds=SEEDS, trace_rounds=2, on_finish=check)
    assert sorted(seen) == list(range(len(ps)))
    assert [seen[i][0] for i in range(len(ps))] == [g.tokens for g in res.generations] == [g.tokens for g in kept.generations]
    assert [seen[i][1] for i in range(len(ps))] == [[(t.start, t.drafts, t.accepted) for t in tr] for tr in kept.traces]
    assert all(tr == [] for tr in res.traces)
    assert res.wall_s < 1000.0 and all(0 < g.wall_s < 1000.0 for g in res.generations)
    assert sum(g.wall_s for g in res.generations) == pytest.approx(res.wall_s, rel=1e-6)


def test_sampled_batches_refuse_a_forced_acceptance_and_need_one_seed_per_prompt(target):
    with pytest.raises(DecodeError, match="cannot be combined with sampling"):
        Engine(target, None, batch_size=2, sampling=SAMPLED, accept_fn=content_accept, slots="ragged")
    with pytest.raises(DecodeError, match="2 seeds for 3 prompts; expected one seed per prompt"):
        Engine(target, None, batch_size=2, sampling=SAMPLED, slots="ragged").decode([[1], [2], [3]], 4, seeds=[1, 2])


def donors_for(ps: list[list[int]]) -> list[list[int]]:
    """Prompt i reads the states of prompt i+1 followed by a few tokens of its own (ragged lengths:
    some donors are shorter than the generation that reads them, so it stops at their last state)."""
    rng = random.Random(7)
    return [ps[(i + 1) % len(ps)] + [rng.randrange(VOCAB) for _ in range(3 * i)] for i in range(len(ps))]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_batched_decoding_on_donor_states_equals_batch_one(target, batch_size):
    """The state placebo / state swap through the batched engine: each slot's drafter reads its own
    donor's states after as many tokens as the row committed, exactly as Engine(donor=...) does (forced
    acceptance, so rows grow raggedly), and the drafts really change with the donor."""
    drafter = make_drafter(target, "ready")
    ps, budgets = prompts(4), [20, 7, 25, 4, 13, 18]
    donors = donors_for(ps)
    want = [Engine(target, drafter, accept_fn=content_accept).generate(p, m, donor=d)
            for p, m, d in zip(ps, budgets, donors)]
    res = Engine(target, drafter, batch_size=batch_size, accept_fn=content_accept, slots="ragged").decode(
        ps, budgets, donors=donors)
    for i, (w, g) in enumerate(zip(want, res.generations)):
        assert fields(g) == fields(w), f"prompt {i} (batch {batch_size})"
    own = Engine(target, drafter, batch_size=batch_size, accept_fn=content_accept, slots="ragged").decode(ps, budgets)
    assert [g.accepted for g in own.generations] != [g.accepted for g in res.generations]
    assert sum(g.wall_s for g in res.generations) == pytest.approx(res.wall_s, rel=1e-6)


def test_donors_are_one_per_prompt_and_need_a_block_drafter(target):
    ps = prompts(4)[:3]
    with pytest.raises(DecodeError, match="2 donors for 3 prompts"):
        Engine(target, make_drafter(target, "ready"), batch_size=2, slots="ragged").decode(ps, 5, donors=ps[:2])
    with pytest.raises(DecodeError, match="DSpark / ReaDy drafter"):
        Engine(target, make_drafter(target, "ngram"), batch_size=2, slots="ragged").decode(ps, 5, donors=ps)
    with pytest.raises(DecodeError, match="has none"):
        Engine(target, batch_size=2, slots="ragged").decode(ps, 5, donors=ps)
    # a drafter that reads no state: the donors change nothing
    dspark = make_drafter(target, "dspark")
    plain = Engine(target, dspark, batch_size=2, slots="ragged").decode(ps, 9).generations
    swapped = Engine(target, dspark, batch_size=2, slots="ragged").decode(ps, 9, donors=ps[::-1]).generations
    assert [fields(g) for g in swapped] == [fields(g) for g in plain]


def eos_inside_a_round(gens) -> tuple[int, int]:
    """(prompt index, token) such that the token first appears in that prompt's output as the first
    accepted draft of a round that committed 2+ tokens."""
    for i, g in enumerate(gens):
        pos = 1  # tokens[0] comes from the prefill
        for c in g.committed:
            if c >= 2 and g.tokens[pos] not in g.tokens[:pos]:
                return i, g.tokens[pos]
            pos += c
    raise AssertionError("no round committed 2+ tokens")


@pytest.mark.parametrize("kind", ["ar", "ngram", "dspark", "ready"])
def test_eos_in_the_middle_of_a_block(target, kind):
    """EOS = a token some row commits as the first accepted draft of a multi-token round (forced
    acceptance): that row stops there, inside its block (horizon 1 < K), while
    the others go on to their budgets or their own EOS, all as in batch 1. AR: EOS mid-sequence."""
    drafter = make_drafter(target, kind)
    ps = prompts(2)
    kw = {"accept_fn": content_accept} if kind != "ar" else {}
    free = [Engine(target, drafter, eos_token_id=-1, **kw).generate(p, 24) for p in ps]
    if kind == "ar":
        row, eos = 2, free[2].tokens[5]
    else:
        row, eos = eos_inside_a_round(free)
    want = check_equal(target, drafter, 4, ps, [24] * len(ps), eos_token_id=eos, **kw)
    assert want[row].stop == "eos" and want[row].tokens[-1] == eos and len(want[row].tokens) < 24
    assert "budget" in [g.stop for g in want]
    if kind != "ar":
        assert want[row].horizons[-1] == 1 and want[row].accepted[-1] == 1


def test_generate_batch_helper_and_a_batch_of_one(target):
    ps = prompts(3)[:3]
    assert [g.tokens for g in generate_batch(target, ps, 9)] == [Engine(target).generate(p, 9).tokens for p in ps]
    one = Engine(target, batch_size=1, slots="ragged").decode(ps[:1], 9).generations[0]
    assert fields(one) == fields(Engine(target).generate(ps[0], 9))


def test_bad_input_is_one_clear_error(target):
    with pytest.raises(DecodeError, match="batch_size"):
        Engine(target, batch_size=0, slots="ragged")
    engine = Engine(target, batch_size=2, slots="ragged")
    with pytest.raises(DecodeError, match="one number or one per prompt"):
        engine.decode([[1, 2], [3]], [4, 5, 6])
    with pytest.raises(DecodeError, match="prompt is empty"):
        engine.decode([[1, 2], []], 4)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["ar", "dspark", "ready"])
def test_batched_equals_batch_one_on_cuda(target, kind):
    """On CUDA (fp32): captured ragged verify per block length and the captured batched draft step, at
    batch sizes 1, 4 and 16 (more slots than prompts), give every row its batch-1 generation."""
    tgt = copy.deepcopy(target).cuda()
    drafter = make_drafter(tgt, kind)
    if drafter is not None:
        drafter = drafter.cuda()
    ps = prompts(4)
    kw = {"accept_fn": content_accept} if kind != "ar" else {}
    want = [Engine(tgt, drafter, **kw).generate(p, m) for p, m in zip(ps, BUDGETS)]
    for b in (1, 4, 16):
        engine = Engine(tgt, drafter, batch_size=b, **kw, slots="ragged")
        assert engine.slots.graphs
        got = engine.decode(ps, list(BUDGETS)).generations
        assert [fields(g) for g in got] == [fields(w) for w in want], f"batch {b}"
        again = engine.decode(ps[::-1], list(BUDGETS[::-1])).generations  # replayed graphs, reused cache
        assert [fields(g) for g in again] == [fields(w) for w in want[::-1]], f"batch {b}, second call"


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["ar", "ready"])
def test_batched_sampling_equals_batch_one_on_cuda(target, kind):
    """Sampled on CUDA (fp32): the captured sampled draft step (uniforms as a static input) and the captured
    ragged verify give every row its batch-1 sampled generation, at batch sizes 1 and 4."""
    tgt = copy.deepcopy(target).cuda()
    drafter = make_drafter(tgt, kind)
    if drafter is not None:
        drafter = drafter.cuda()
    ps = prompts(2)
    want = [Engine(tgt, drafter, sampling=SAMPLED).generate(p, m, seed=s) for p, m, s in zip(ps, BUDGETS, SEEDS)]
    for b in (1, 4):
        engine = Engine(tgt, drafter, batch_size=b, sampling=SAMPLED, slots="ragged")
        got = engine.decode(ps, list(BUDGETS), seeds=SEEDS).generations
        assert [fields(g) for g in got] == [fields(w) for w in want], f"batch {b}"
        if kind == "ready":
            assert engine.slots.draft_step.graph is not None


def test_rows_that_reach_the_end_of_the_context(target):
    """Prompt + budget = the target's whole context: the last rounds verify K drafts past it (the
    cache's spare positions), and nothing past a row's budget leaks into what it commits."""
    ctx = target.config.max_position_embeddings
    ps = [[i % VOCAB for i in range(1, ctx - 20)], [5, 6, 7], [i * 7 % VOCAB for i in range(3, ctx - 30)]]
    budgets = [20, 20, 30]
    check_equal(target, make_drafter(target, "ready"), 2, ps, budgets, accept_fn=content_accept)


@pytest.mark.parametrize("kind", ["ar", "ngram"])
def test_exact_mode_batched_equals_batch_one_in_bfloat16(target, kind):
    """Exact mode, bfloat16: the ragged verify runs the row-invariant ops (exact linears and norms,
    fixed-order attention with per-row key counts, token-by-token GDN), so a row's bits do not depend on
    the batch: the tokens equal batch 1 exactly, under forced acceptance too. The drafts come from a
    drafter whose output depends on the tokens only: a DSpark/ReaDy drafter's 16-bit ops are not
    row-invariant (its batched draft step equals batch 1 in float32: the tests above), and near-ties
    of an untrained one flip between the two paths."""
    bf = copy.deepcopy(target).to(torch.bfloat16)
    bf.exact = True
    kw = {"accept_fn": content_accept} if kind != "ar" else {}
    check_equal(bf, make_drafter(bf, kind), 4, prompts(5)[:5], [9, 4, 12, 1, 7], **kw)


class ScoredNgram(NgramDrafter):
    """The n-gram drafter with a confidence head's scores that depend on the committed tokens only (so a
    ragged row scores as its batch-1 generation): c_j from a hash of the context, on both sides of 0.5."""

    confidence_head = True

    def draft_scored(self, step, sampling=None):
        drafts = self.propose(step)
        rng = random.Random(hash(tuple(step.tokens[0].tolist())) & 0xFFFF)
        return drafts, None, torch.tensor([[rng.choice([0.2, 0.55, 0.9]) for _ in range(self.proposals)]])


SCHEDULE = VerifySchedule("confidence", 0.5)


@pytest.mark.parametrize("kind", ["scored_ngram", "dspark_head"])
def test_scheduled_batched_equals_batch_one(target, kind):
    """Under a confidence schedule (forced content acceptance, so rows accept 0..L_b): every row's tokens,
    rounds and verified drafts equal its batch-1 generation's, with the rows of one pass verifying
    different lengths."""
    drafter = (ScoredNgram(VOCAB, 3) if kind == "scored_ngram" else
               drafter_mod.DSparkDrafter(DrafterConfig(proposals=3, num_layers=2, head_rank=8, confidence_head=True),
                                         ReaderConfig(enabled=True, rank=4, mlp_hidden=16), target).eval())
    if kind == "dspark_head":
        with torch.no_grad():
            drafter.confidence_head.proj.weight.normal_(0.0, 0.15, generator=torch.Generator().manual_seed(2))
    ps = prompts(3)
    want = [Engine(target, drafter, accept_fn=content_accept, verify_schedule=SCHEDULE).generate(p, m)
            for p, m in zip(ps, BUDGETS)]
    got = Engine(target, drafter, batch_size=4, accept_fn=content_accept, verify_schedule=SCHEDULE,
                 slots="ragged").decode(ps, list(BUDGETS)).generations
    assert [fields(g) + (g.verified,) for g in got] == [fields(w) + (w.verified,) for w in want]
    assert len({n for w in want for n in w.verified}) >= 3


def test_exact_mode_batched_under_a_confidence_schedule_equals_batch_one_in_bfloat16(target):
    """Exact mode, bfloat16: a ragged pass of the longest scheduled row's width gives every row the bits of
    its batch-1 verify of its own length."""
    bf = copy.deepcopy(target).to(torch.bfloat16)
    bf.exact = True
    check_equal(bf, ScoredNgram(VOCAB, 3), 4, prompts(5)[:5], [9, 4, 12, 1, 7], accept_fn=content_accept,
                verify_schedule=SCHEDULE)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["dspark", "ready"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_scheduled_batched_equals_batch_one_on_cuda(target, kind, temperature):
    """On CUDA (fp32): a confidence schedule verifies through the graph of every block length (captured when
    the engine is sized, single slot and ragged widths) and the captured draft steps' confidences; every row
    equals its batch-1 generation at B = 1 and 4, greedy (forced content acceptance) and sampled."""
    tgt = copy.deepcopy(target).cuda()
    torch.manual_seed(6)
    drafter = drafter_mod.DSparkDrafter(DrafterConfig(proposals=3, num_layers=2, head_rank=8, confidence_head=True),
                                        ReaderConfig(enabled=kind == "ready", rank=4, mlp_hidden=16), tgt).eval().cuda()
    with torch.no_grad():
        drafter.confidence_head.proj.weight.normal_(0.0, 0.15)
    kw = {"accept_fn": content_accept} if temperature == 0 else {"sampling": SamplingParams(temperature, 1.0, 0)}
    seeds = {} if temperature == 0 else {"seed": 0}
    ps = prompts(2)
    single = Engine(tgt, drafter, verify_schedule=SCHEDULE, **kw)
    single.reserve(max(len(p) for p in ps) + max(BUDGETS))
    assert set(single.slots.graphs.graphs) == {1, 2, 3, 4}  # every length the schedule can ask for
    want = [single.generate(p, m, **seeds) for p, m in zip(ps, BUDGETS)]
    for b in (1, 4):
        engine = Engine(tgt, drafter, batch_size=b, slots="ragged", verify_schedule=SCHEDULE, **kw)
        got = engine.decode(ps, list(BUDGETS), **({} if temperature == 0 else {"seeds": [0] * len(ps)})).generations
        assert [fields(g) + (g.verified,) for g in got] == [fields(w) + (w.verified,) for w in want], f"batch {b}"
        assert engine.slots.draft_step.graph is not None


def _verify_logits(model: HybridLM, device: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits of one [4, 4] ragged verify after prompts of four lengths, and of each row's batch-1 verify."""
    from ready.target.ragged import new_ragged_cache, prefill_row, ragged_verify

    gen = torch.Generator().manual_seed(0)
    ps = [torch.randint(0, VOCAB, (n,), generator=gen).to(device) for n in (5, 17, 9, 30)]
    blocks = torch.randint(0, VOCAB, (4, 4), generator=gen).to(device)
    with torch.inference_mode():
        cache = new_ragged_cache(model, 4, 64, max_verify=4)
        for b, p in enumerate(ps):
            prefill_row(model, cache, b, p)
        batched = ragged_verify(model, blocks, cache).logits
        single = []
        for b, p in enumerate(ps):
            one = model.new_cache(1, 64, max_verify=4)
            model.prefill(p[None], one)
            single.append(model.verify(blocks[b:b + 1], one).logits[0])
    return batched, single


@pytest.mark.parametrize("exact", [False, True])
def test_ragged_verify_logits_match_the_single_sequence_verify(target, exact):
    """Row b of a ragged verify after a prompt of its own length = the batch-1 verify of that row (exact
    mode: bit for bit, in bfloat16)."""
    model = copy.deepcopy(target)
    if exact:
        model = model.to(torch.bfloat16)
        model.exact = True
    batched, single = _verify_logits(model, "cpu")
    for b, s in enumerate(single):
        if exact:
            assert torch.equal(batched[b], s), f"row {b}"
        else:
            torch.testing.assert_close(batched[b], s, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["ar", "ready"])
def test_exact_mode_batched_is_bit_identical_on_cuda(target, kind):
    """bfloat16, exact mode, on CUDA (Triton exact linears/norms/attention, the fused GDN verify): the ragged
    verify's logits equal each row's batch-1 verify bit for bit, and the batched engine (graphs captured per
    batch size) gives every row its batch-1 generation at B = 4 and 16."""
    tgt = copy.deepcopy(target).cuda().to(torch.bfloat16)
    tgt.exact = True
    batched, single = _verify_logits(tgt, "cuda")
    assert all(torch.equal(batched[b], s) for b, s in enumerate(single))
    drafter = make_drafter(tgt, kind)
    if drafter is not None:
        drafter = drafter.to(device="cuda", dtype=torch.bfloat16)
    kw = {"accept_fn": content_accept} if kind != "ar" else {}
    ps = prompts(6)
    want = [Engine(tgt, drafter, **kw).generate(p, m) for p, m in zip(ps, BUDGETS)]
    for b in (4, 16):
        got = Engine(tgt, drafter, batch_size=b, **kw, slots="ragged").decode(ps, list(BUDGETS)).generations
        assert [fields(g) for g in got] == [fields(w) for w in want], f"batch {b}"
