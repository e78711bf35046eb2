"""Exact mode and the greedy-validity check (issue 18), on CPU.

- Exact mode (`target.exact`): verify of K+1 tokens and K+1 AR steps give bit-identical logits, GDN
  states and conv windows in bfloat16 (the fast path does not promise it: CPU bf16 kernels pick
  their blocking by shape too), so the engine's speculative output equals AR token for token, with
  drafts partly accepted, a shortened last round, and with or without the graphs' static path.
- The row-invariant ops: exact_linear (row by row on CPU; the Triton kernel under the interpreter),
  row_norm's tree sum.
- greedy_valid: a planted wrong token is a loud failure; a planted tie (within the margin) is counted
  as a tie flip and tolerated.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from ready.decode import Engine, Generation, LosslessWarning, NgramDrafter, evaluate, run_ar
from ready.decode.evaluate import check_greedy
from ready.target import HybridConfig, HybridLM
from ready.target.layers import commit_gdn

torch.set_num_threads(1)
VOCAB = 256


def tiny_config(**kw) -> HybridConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    return HybridConfig(**{**base, **kw})


def make_target(dtype=torch.bfloat16, exact=True, seed=7) -> HybridLM:
    torch.manual_seed(seed)
    m = HybridLM(tiny_config()).eval().to(dtype)
    m.exact = exact
    return m


@pytest.fixture(scope="module")
def exact_bf16() -> HybridLM:
    return make_target()


def replayed(model: HybridLM, c, T: int):
    """The GDN states and conv windows [L, T, ...] (row 0) that commit(n) would install for n = 1..T after
    a verify, read without committing (on copies of the live cache)."""
    states, conv = [], []
    for n in range(1, T + 1):
        s, w = c.ssm.clone(), c.conv.clone()
        commit_gdn(s, w, c.pending_inputs, c.pending_conv, n, bool(model.exact), c.pending_states)
        states.append(s[:, 0])
        conv.append(w[:, 0])
    return torch.stack(states, 1), torch.stack(conv, 1)


def verify_vs_steps(model: HybridLM, static: bool, T: int = 8):
    """(logits, states, conv) of verify(block) and of T single-token steps from the same prefix."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, 21), generator=g)
    block = torch.randint(0, VOCAB, (1, T), generator=g)

    def fresh():
        c = model.new_cache(1, 64, T)
        model.prefill(prompt, c)
        c.static = static
        return c

    c = fresh()
    logits = model.verify(block, c).logits[0]
    got = (logits, *replayed(model, c, T))
    c = fresh()
    rows, states, conv = [], [], []
    for i in range(T):
        rows.append(model.verify(block[:, i:i + 1], c).logits[0, 0])
        model.commit(c, 1)
        states.append(c.ssm[:, 0].clone())
        conv.append(c.conv[:, 0].clone())
    return got, (torch.stack(rows), torch.stack(states, 1), torch.stack(conv, 1))


@pytest.mark.parametrize("static", [False, True], ids=["growing_cache", "static_cache"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_exact_verify_equals_steps_bit_for_bit(static, dtype):
    model = make_target(dtype)
    (lv, sv, cv), (ls, ss, cs) = verify_vs_steps(model, static)
    assert torch.equal(lv, ls), f"logits differ by {(lv.float() - ls.float()).abs().max()}"
    assert torch.equal(sv, ss) and torch.equal(cv, cs)


@pytest.mark.parametrize("static", [True, False], ids=["static_cache", "growing_cache"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_verify_ignores_the_cache_capacity(static, dtype):
    """The AR and the speculative engine size their caches differently (and budgets change them): exact
    attention reads keys 0..pos in a fixed block order, so the capacity never changes a bit (the
    per-row SDPA over the whole static buffer it replaced did, in fp32 on CPU already)."""
    model = make_target(dtype)
    g = torch.Generator().manual_seed(1)
    prompt, block = torch.randint(0, VOCAB, (1, 150), generator=g), torch.randint(0, VOCAB, (1, 8), generator=g)
    logits = []
    for capacity in (160, 175, 250):
        c = model.new_cache(1, capacity, 8)
        model.prefill(prompt, c)
        c.static = static
        logits.append(model.verify(block, c).logits[0])
    assert all(torch.equal(logits[0], x) for x in logits[1:])


def graphed_verify_vs_steps_in_capacities(device: str, capacities=(160, 250)) -> list[torch.Tensor]:
    """bf16 exact target: the logits of verify(8) through its CUDA graph (compiled layers, as the engine
    runs it) and of 8 graphed steps, from a 150-token prefix, in static caches of each capacity."""
    from ready.target import GraphedVerify

    model = make_target().to(device)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (1, 150), generator=g).to(device)
    block = torch.randint(0, VOCAB, (1, 8), generator=g).to(device)

    def fresh(capacity):
        c = model.new_cache(1, capacity, 8)
        c.static = True  # the engine's graphs: static from the prefill on
        model.prefill(prompt, c)
        return c

    out = []
    for capacity in capacities:
        out.append(GraphedVerify(model, fresh(capacity), 8)(block).logits[0].clone())
        c = fresh(capacity)
        step = GraphedVerify(model, c, 1)
        rows = []
        for i in range(8):
            rows.append(step(block[:, i:i + 1]).logits[0, 0].clone())
            model.commit(c, 1)
        out.append(torch.stack(rows))
    return out


@pytest.mark.cuda
def test_cuda_exact_graphed_verify_equals_steps_in_any_capacity():
    logits = graphed_verify_vs_steps_in_capacities("cuda")
    assert all(torch.equal(logits[0], x) for x in logits[1:]), \
        [float((logits[0].float() - x.float()).abs().max()) for x in logits[1:]]


def test_exact_mode_is_only_for_verify(exact_bf16):
    """Prefill and the teacher-forced forward keep the fast path; the flag is read per pass."""
    ids = torch.randint(0, VOCAB, (1, 9))
    exact_bf16.exact = False
    fast = exact_bf16(ids).logits
    exact_bf16.exact = True
    assert torch.equal(exact_bf16(ids).logits, fast)


class OracleDrafter:
    """Proposes the AR continuation with every `wrong`-th draft replaced: acceptance of every length."""

    def __init__(self, ar: dict[tuple, list[int]], k: int, wrong: int = 5):
        self.proposals, self.vocab_size, self.capture_layers = k, VOCAB, []
        self.ar, self.wrong, self.calls = ar, wrong, 0
        self.prompt: tuple = ()

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.prompt = tuple(prompt_ids[0].tolist())

    def propose(self, step) -> torch.Tensor:
        n = step.tokens.shape[1] - len(self.prompt)  # new tokens committed so far
        cont = self.ar[self.prompt][n:n + self.proposals]
        cont = cont + [0] * (self.proposals - len(cont))
        out = []
        for tok in cont:
            self.calls += 1
            out.append((tok + 1) % VOCAB if self.calls % self.wrong == 0 else tok)
        return torch.tensor([out])


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs_static_path"])
def test_exact_engine_output_equals_ar_with_partial_acceptance(exact_bf16, graphs):
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 13, 30)]
    budget = 37  # not a multiple of K+1: the last round is shortened (padded into the K+1 graph)
    ar = {tuple(p): g.tokens for p, g in zip(prompts, run_ar(exact_bf16, prompts, budget, warmup=0, progress=False,
                                                              cuda_graphs=graphs))}
    drafter = OracleDrafter(ar, k=4)
    engine = Engine(exact_bf16, drafter, cuda_graphs=graphs)
    accepted = []
    for p in prompts:
        gen = engine.generate(p, budget)
        assert gen.tokens == ar[tuple(p)]
        accepted += gen.accepted
    assert 0 in accepted and max(accepted) == 4  # rejections and full blocks both happened


class ScoredOracleDrafter(OracleDrafter):
    """`OracleDrafter` with a confidence head's scores: c_j cycles over 0.9, 0.9, 0.3, 0.9, 0.1, ... so a
    confidence schedule at 0.5 verifies 0, 1, 2 ... K drafts in turn."""

    confidence_head = True
    CYCLE = (0.9, 0.9, 0.3, 0.9, 0.1, 0.9, 0.9, 0.9)

    def draft_scored(self, step, sampling=None):
        drafts = self.propose(step)
        start = self.calls // self.proposals
        conf = [self.CYCLE[(start + j) % len(self.CYCLE)] for j in range(self.proposals)]
        return drafts, None, torch.tensor([conf])


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs_static_path"])
def test_exact_engine_output_equals_ar_under_a_confidence_schedule(exact_bf16, graphs):
    """Every block length 1..K+1 verified as the schedule decides (its own graph on the static path), in
    bfloat16 exact mode: still AR token for token."""
    from ready.decode.schedule import VerifySchedule

    rng = random.Random(4)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 13, 30)]
    budget = 37
    ar = {tuple(p): g.tokens for p, g in zip(prompts, run_ar(exact_bf16, prompts, budget, warmup=0, progress=False,
                                                              cuda_graphs=graphs))}
    engine = Engine(exact_bf16, ScoredOracleDrafter(ar, k=4), cuda_graphs=graphs,
                    verify_schedule=VerifySchedule("confidence", 0.5))
    verified = []
    for p in prompts:
        gen = engine.generate(p, budget)
        assert gen.tokens == ar[tuple(p)]
        verified += gen.verified
    assert set(verified) >= {0, 1, 2, 4}


def test_exact_engine_pads_the_short_last_round_into_the_block_graph(exact_bf16):
    engine = Engine(exact_bf16, NgramDrafter(VOCAB, 3), cuda_graphs=True)
    shapes = []
    real = engine.slots.graphs.verify
    engine.slots.graphs.verify = lambda block, cache: shapes.append(block.shape[1]) or real(block, cache)
    gen = engine.generate([1, 2, 3, 4], 10)
    assert len(gen.tokens) == 10 and set(shapes) == {4}  # every verify, the last one too, has K+1 rows
    assert engine.slots.cache.max_len == 4 + 10 + 15  # EXACT_PAD spare positions (AR engines too)
    assert Engine(exact_bf16, None, cuda_graphs=True).slots.pad_room(14) == 15


def test_ngram_evaluate_in_exact_bf16_is_lossless_exact(exact_bf16):
    rng = random.Random(5)
    ps = [([rng.randrange(VOCAB) for _ in range(4)] * 6)[:n] for n in (7, 19, 24)]
    res = evaluate(exact_bf16, NgramDrafter(VOCAB, 5), ps, 40, warmup=0, progress=False)
    assert res.exact and res.lossless_exact == 1 and res.greedy_valid == 1 and res.lossless == 1
    assert res.tie_flips == 0 and res.min_margin is None and res.metrics.lossless == 1
    assert all(p.lossless_exact == 1 and p.tie_flips == 0 for p in res.prompts)


# --- the row-invariant ops ---------------------------------------------------------------------------
def rows_invariant(fn, x: torch.Tensor) -> bool:
    single = [fn(x[i:i + 1]) for i in range(x.shape[0])]
    return all(torch.equal(fn(x[:m])[i:i + 1], single[i]) for m in range(1, x.shape[0] + 1) for i in range(m))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_exact_linear_reference_rows_are_invariant(dtype):
    from ready_kernels.small_m_gemm import exact_linear

    x = torch.randn(9, 200).to(dtype)
    w = (torch.randn(72, 200) / 14).to(dtype)
    assert rows_invariant(lambda a: exact_linear(a, w), x)
    assert torch.allclose(exact_linear(x, w).float(), (x.float() @ w.float().T), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("d", [5, 64, 200])
def test_row_norm_reference_rows_are_invariant_and_right(d):
    from ready_kernels.row_norm import row_norm, row_norm_reference, tree_sum

    x = torch.randn(7, d).to(torch.bfloat16)
    w = torch.randn(d)
    assert rows_invariant(lambda a: row_norm(a, w, 1e-6, 1.0), x)
    want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)
    assert torch.allclose(row_norm_reference(x, w, 1e-6, 1.0, out_dtype=torch.float32), want, rtol=1e-5, atol=1e-5)
    l2 = row_norm_reference(x.float(), None, 1e-6, mean=False)
    assert torch.allclose(l2.norm(dim=-1), torch.ones(7), atol=1e-4)
    assert torch.allclose(tree_sum(x.float())[..., 0], x.float().sum(-1), atol=1e-4)


# --- greedy_valid --------------------------------------------------------------------------------------
class FixedLogits(torch.nn.Module):
    """A 'target' whose teacher-forced logits are given: row i predicts new token i."""

    def __init__(self, rows: torch.Tensor, prompt_len: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.bfloat16))
        self.rows, self.p = rows, prompt_len
        self.dtype = torch.bfloat16

    def forward(self, ids):
        V = self.rows.shape[1]
        out = torch.zeros(1, ids.shape[1], V)
        out[0, self.p - 1:self.p - 1 + self.rows.shape[0]] = self.rows
        return type("Out", (), {"logits": out})()


def logits_rows(n: int, top: list[int], V: int = 16) -> torch.Tensor:
    rows = torch.linspace(-2, 2, V).repeat(n, 1)
    for i, t in enumerate(top):
        rows[i, t] = 10.0
    return rows


def test_check_greedy_tolerates_a_planted_tie_and_counts_it():
    rows = logits_rows(4, [3, 4, 5, 6])
    rows[1, 9] = 9.9  # token 9 within the margin (2^-4 * 10) of the top-1 token 4: a tie
    rows[2, 5], rows[2, 7] = 10.0, 10.0 - 1 / 32
    tf = FixedLogits(rows, prompt_len=3)
    v = check_greedy(tf, torch.tensor([1, 2, 3]), [3, 4, 5, 6], [3, 9, 5, 6])
    assert (v.lossless_exact, v.greedy_valid, v.tie_flips) == (0, 1, 1)
    assert v.min_margin == pytest.approx(-0.1, abs=1e-3)
    assert check_greedy(tf, torch.tensor([1, 2, 3]), [3, 4, 5, 6], [3, 4, 5, 6]).lossless_exact == 1


def test_check_greedy_fails_a_planted_wrong_token():
    rows = logits_rows(4, [3, 4, 5, 6])
    tf = FixedLogits(rows, prompt_len=3)
    v = check_greedy(tf, torch.tensor([1, 2, 3]), [3, 4, 5, 6], [3, 4, 11, 6])
    assert v.greedy_valid == 0 and v.failure["position"] == 2 and v.failure["who"] == "speculative"
    assert v.failure["deficit"] > v.failure["margin"]
    # a later token past the margin fails too, even when the divergence itself was a tie
    rows[1, 9] = 9.95
    v = check_greedy(tf, torch.tensor([1, 2, 3]), [3, 4, 5, 6], [3, 9, 5, 12])
    assert v.greedy_valid == 0 and v.failure["position"] == 3


def test_evaluate_tolerates_a_planted_tie_and_fails_a_planted_wrong_token():
    model = make_target(torch.float32, exact=False, seed=11)
    ps = [[5, 6, 7], [9, 10, 11, 12, 13]]
    ar = run_ar(model, ps, 12, warmup=0, progress=False)

    def planted(prompt_i: int, pos: int, tok: int) -> list[Generation]:
        out = [Generation(prompt_len=g.prompt_len, tokens=list(g.tokens), proposals=0, accepted=g.accepted,
                          horizons=g.horizons, wall_s=g.wall_s) for g in ar]
        out[prompt_i].tokens[pos] = tok
        return out

    # the target's own runner-up at new token 4 of prompt 1, with a margin wide enough to call it a tie
    logits = model(torch.tensor([ps[1] + ar[1].tokens[:4]])).logits[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    with _no_lossless_warning():
        res = evaluate(model, NgramDrafter(VOCAB, 3), ps, 12, ar=planted(1, 4, runner_up), warmup=0, progress=False,
                       tie_rel=10.0)
    assert (res.lossless_exact, res.greedy_valid, res.lossless) == (0, 1, 1) and res.tie_flips >= 1
    assert res.prompts[1].lossless_exact == 0 and res.prompts[0].lossless_exact == 1
    with pytest.warns(LosslessWarning, match="prompt 1, new token 4"):
        res = evaluate(model, NgramDrafter(VOCAB, 3), ps, 12, ar=planted(1, 4, (ar[1].tokens[4] + 1) % VOCAB),
                       warmup=0, progress=False)
    assert (res.lossless_exact, res.greedy_valid, res.lossless, res.metrics.lossless) == (0, 0, 0, 0)
    json.dumps(res.to_dict())


class _no_lossless_warning:
    def __enter__(self):
        self._cm = __import__("warnings").catch_warnings(record=True)
        self.caught = self._cm.__enter__()
        __import__("warnings").simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        assert not [w for w in self.caught if issubclass(w.category, LosslessWarning)]
        return False


def test_generate_cli_reports_both_checks(capsys, tmp_path):
    from sweeps.commands.generate import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("[1, 2, 3, 4, 5, 6, 7, 8]\n[9, 8, 7]\n")
    code = main(["--target", "tiny", "--method", "ngram", "--prompts", str(prompts), "--max-new-tokens", "20",
                 "target.dtype=bfloat16", "--check-lossless", "eval.exact=on", "--json", "target.device=cpu"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["exact"] is True
    assert report["lossless"] == report["greedy_valid"] == report["lossless_exact"] == 1
    assert report["tie_flips"] == 0 and all(r["lossless_exact"] == 1 for r in report["results"])


def test_tables_footnote_counts_tie_flips():
    from reports.tables import _tie_flip_note

    ev = {"run1": {"benchmarks": {"humaneval": {"prompts": [
        {"lossless_exact": 1, "greedy_valid": 1, "tie_flips": 0},
        {"lossless_exact": 0, "greedy_valid": 1, "tie_flips": 3}]}}},
          "run2": {"benchmarks": {"humaneval": {"prompts": [{"lossless_exact": 0, "greedy_valid": 1, "tie_flips": 2}]}}}}
    note = _tie_flip_note(ev)
    assert "2 prompt decode(s)" in note and "5 tie flip(s)" in note
    assert _tie_flip_note({"run1": {"benchmarks": {"b": {"prompts": [{"lossless": 1}]}}}}) is None
