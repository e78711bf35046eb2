"""The drafter's static draft step (the body of its CUDA graph) equals the eager draft and training;
it reads the states of the cache it is handed, never those of the cache a graph was made for.

On CPU `cuda_graphs=True` runs the static path eagerly (fixed shapes, the whole context buffer with
a length mask, the last K+1 context rows re-projected in place); the `cuda` tests capture and replay,
and in bf16 attend with the split-key kernel over keys < n + N only.
"""

import pytest
import torch

from ready.decode.protocol import DraftStep
from tests.test_drafter import V, draft_step, drafter_for, teacher, tiny_target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def target():
    return tiny_target().to(DEVICE)


def _pair(target, **kw):
    """Two drafters with the same weights: eager (no graphs) and static."""
    eager = drafter_for(target, **kw).to(DEVICE)
    eager.cuda_graphs = False
    static = drafter_for(target, **kw).to(DEVICE)
    static.cuda_graphs = True
    return eager, static


def _rounds(target, drafters, prompt_len=9, commits=(3, 1, 5, 2), seed=3):
    """Engine-like rounds: one features buffer that grows by the committed count, a cache with the
    states of every committed token but the last. Yields each drafter's (tokens, logits) per round."""
    torch.manual_seed(seed)
    total = prompt_len + sum(commits) + 1
    ids = torch.randint(0, V, (2, total), device=DEVICE)
    d0 = drafters[0]
    feats = target(ids, capture_layers=d0.capture_layers).hidden  # teacher features of every token
    buf = torch.zeros_like(feats)
    for d in drafters:
        d.begin(ids[:, :prompt_len])
    t = prompt_len
    for c in (0,) + tuple(commits):
        t += c
        buf[:, : t - 1] = feats[:, : t - 1]
        cache = target.new_cache(2, max_len=64)
        target.prefill(ids[:, : t - 1], cache)
        step = DraftStep(tokens=ids[:, :t], features=buf[:, : t - 1], target=target, cache=cache)
        yield [d.draft(step) for d in drafters]


@pytest.mark.parametrize("head,position,window,context", [("vanilla", "post", 0, None), ("gated", "pre", 0, None),
                                                          ("rnn", "post", 0, None), ("vanilla", "post", 3, None),
                                                          ("vanilla", "post", 1, [-1]), ("none", "post", 0, None)])
def test_static_draft_equals_eager_draft_round_after_round(target, head, position, window, context):
    """Also over the positive control's context: the token embeddings (-1) of the last committed token."""
    kw = {} if context is None else {"context_layers": context}
    eager, static = _pair(target, head=head, position=position, inject_layers=[0, -1], context_window=window, **kw)
    for (te, le), (ts, ls) in _rounds(target, [eager, static]):
        torch.testing.assert_close(ls, le, rtol=1e-4, atol=1e-4)
        assert torch.equal(ts, te)


@pytest.mark.parametrize("window", [0, 3])
def test_split_key_attention_over_the_buffer_equals_the_eager_draft(target, monkeypatch, window):
    """Where the split-key kernel serves the block (16-bit CUDA), the static step writes the block after the
    context and reads keys < n + N only; here its reference (plain torch, the kernel's semantics) stands in."""
    import importlib

    import ready.drafter.model as drafter_model

    reference = importlib.import_module("ready_kernels.decode_attention").decode_attention_reference
    chosen = []

    def use_reference(*args):
        chosen.append(args)
        return reference

    monkeypatch.setattr(drafter_model, "split_kv_attention", use_reference)
    eager, static = _pair(target, context_window=window, inject_layers=[0, -1])
    for (te, le), (ts, ls) in _rounds(target, [eager, static]):
        torch.testing.assert_close(ls, le, rtol=1e-4, atol=1e-4)
        assert torch.equal(ts, te)
    assert chosen  # the static step asked for the split-key path


def test_static_draft_equals_teacher_forced_training(target):
    d = drafter_for(target, context_window=4).to(DEVICE)
    d.cuda_graphs = True
    torch.manual_seed(1)
    prompt = torch.randint(0, V, (2, 11), device=DEVICE)
    toks, logits = d.draft(draft_step(target, d, prompt))
    ids = torch.cat([prompt, toks, torch.randint(0, V, (2, 2), device=DEVICE)], dim=1)
    anchors = torch.tensor([[10, 3], [4, 10]], device=DEVICE)
    hidden, states = teacher(target, d, ids, anchors)
    train = d.forward_train(ids, hidden, anchors, states)
    torch.testing.assert_close(train[0, 0], logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(train[1, 1], logits[1], rtol=1e-4, atol=1e-4)


def test_each_cache_gets_its_own_static_step_and_reads_its_own_states(target):
    """The state placebo hands the drafter another (donor) cache: the draft reads that cache's states."""
    eager, static = _pair(target)
    torch.manual_seed(4)
    ids = torch.randint(0, V, (2, 12), device=DEVICE)
    own = draft_step(target, static, ids)
    donor = draft_step(target, static, torch.randint(0, V, (2, 12), device=DEVICE))
    donor_step = DraftStep(tokens=own.tokens, features=own.features, target=target, cache=donor.cache)
    for d in (eager, static):
        d.begin(ids)
    a = static.draft(own)[1]
    b = static.draft(donor_step)[1]
    c = static.draft(own)[1]
    torch.testing.assert_close(a, eager.draft(own)[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, eager.draft(donor_step)[1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, b)  # the donor's states change the draft ...
    torch.testing.assert_close(c, a, rtol=0, atol=0)  # ... and the own cache's step is untouched by it
    assert len(static._graphs) == 2 and {id(g.cache()) for g in static._graphs} == {id(own.cache), id(donor.cache)}
    own.cache.ssm.mul_(2.0)  # states change in place: the same step reads the new values
    torch.testing.assert_close(static.draft(own)[1], eager.draft(own)[1], rtol=1e-4, atol=1e-4)


def test_context_buffers_grow_and_keep_their_rows(target):
    eager, static = _pair(target)
    torch.manual_seed(5)
    ids = torch.randint(0, V, (1, 63), device=DEVICE)
    small = draft_step(target, static, ids[:, :20])
    small.cache = target.new_cache(1, max_len=24)  # room for 24 positions only
    target.prefill(ids[:, :19], small.cache)
    static.begin(ids)
    static.draft(small)
    cap = static._ctx["cap"]
    big = draft_step(target, static, ids)  # 62 context rows + K+1: the buffers grow past `cap` = 64
    static.begin(ids)
    eager.begin(ids)
    torch.testing.assert_close(static.draft(big)[1], eager.draft(big)[1], rtol=1e-4, atol=1e-4)
    assert static._ctx["cap"] > cap


def test_new_weights_drop_the_captured_steps(target):
    _, static = _pair(target)
    ids = torch.randint(0, V, (1, 12), device=DEVICE)
    static.begin(ids)
    static.draft(draft_step(target, static, ids))
    assert static._graphs
    static.begin(ids)  # same weights: kept
    assert static._graphs
    static.to(torch.float64)  # other tensors: a captured graph would read freed memory
    static.begin(ids)
    assert static._graphs == []


@pytest.mark.cuda
@pytest.mark.parametrize("head", ["vanilla", "none"])  # none: a DFlash drafter, no Markov head
def test_captured_draft_step_replays_the_eager_numbers(head):
    tgt = tiny_target().cuda()
    eager, static = _pair(tgt, head=head)
    static.cuda_graphs = None  # auto: captured on CUDA
    for (te, le), (ts, ls) in _rounds(tgt, [eager, static]):
        torch.testing.assert_close(ls, le, rtol=1e-4, atol=1e-4)
    assert static._graphs and all(g.graph is not None for g in static._graphs)


@pytest.mark.cuda
def test_captured_bf16_step_with_split_key_attention_matches_the_masked_buffer(monkeypatch):
    """In bf16 on CUDA the captured step attends with the split-key kernel (keys < n + N only); it agrees
    with SDPA over the masked whole buffer to bf16 rounding."""
    import ready.drafter.model as drafter_model
    from ready.target.layers import split_kv_attention

    tgt = tiny_target().cuda().to(torch.bfloat16)
    split, masked = (drafter_for(tgt, inject_layers=[0, -1]).cuda().to(torch.bfloat16) for _ in range(2))
    masked.load_state_dict(split.state_dict())
    attn = split.layers[0].self_attn
    assert split_kv_attention(torch.bfloat16, torch.device("cuda"), attn.num_heads, attn.num_kv_heads,
                              split.proposals + 1) is not None
    got = [ls for (_, ls), in _rounds(tgt, [split])]
    monkeypatch.setattr(drafter_model, "split_kv_attention", lambda *a: None)
    want = [ls for (_, ls), in _rounds(tgt, [masked])]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
def test_bf16_draft_on_the_small_m_gemm_and_triton_norms_matches_the_torch_ops(monkeypatch):
    """Drafting on CUDA the draft layers' projections run the small-M GEMM (`triton` mode: always its
    kernel) and their norms one Triton kernel each; the proposals' logits agree with the torch ops' to
    bf16 rounding, captured and eager alike."""
    from ready import fastops
    from ready_kernels import small_m_gemm as sm

    tgt = tiny_target().cuda().to(torch.bfloat16)
    fast, plain = (drafter_for(tgt, inject_layers=[0, -1]).cuda().to(torch.bfloat16) for _ in range(2))
    plain.load_state_dict(fast.state_dict())
    fast.cuda_graphs = None  # captured
    assert fastops.drafting_ops() is not None
    monkeypatch.setattr(sm, "_MODE", "triton")
    got = [ls for (_, ls), in _rounds(tgt, [fast])]
    monkeypatch.setattr(sm, "_MODE", "torch")
    monkeypatch.setattr(fastops, "_DRAFTING", False)
    plain.cuda_graphs = False
    want = [ls for (_, ls), in _rounds(tgt, [plain])]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=3e-2, atol=3e-2)
    assert fast._graphs and all(g.graph is not None for g in fast._graphs)


def test_the_one_launch_rotary_serves_every_draft_path_with_the_torch_bits(target, monkeypatch):
    """The rotary kernel's output (heads transposed out of [B, N, H, hd]) feeds the eager and the static
    draft alike, and its storing form writes the static draft's context keys and values into their
    buffers; in float32 (here through Triton's interpreter) the drafts are the torch ops' bits."""
    import ready.drafter.layers as layers

    if DEVICE != "cpu":
        pytest.skip("runs ready_kernels.rope on the CPU interpreter (the CUDA test below covers the GPU)")
    from ready_kernels.rope import rope_store_triton, rope_triton

    eager, static = _pair(target, inject_layers=[0, -1])
    want = list(_rounds(target, [eager, static]))
    monkeypatch.setattr(layers, "apply_rope", rope_triton)
    monkeypatch.setattr(layers, "store_rotated", rope_store_triton)
    got = list(_rounds(target, [eager, static]))
    for rw, rg in zip(want, got):
        for (tw, lw), (tg, lg) in zip(rw, rg):
            assert torch.equal(tw, tg) and torch.equal(lw, lg)


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["add_argmax", "rope", "rope_store"])
@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_exact_drafting_kernels_give_the_bits_of_the_torch_ops(monkeypatch, head, op):
    """Three of the captured bf16 draft step's kernels round exactly as the torch ops they replace: the
    Markov head's add and argmax in one pass (`ready_kernels.add_argmax`), each rotary in one launch
    (`ready_kernels.rope`) and the keys' rotary with both K and V written into the context buffers
    (`rope_store`). With the torch ops in their place the tokens and the float32 logits are the same
    bits, round after round."""
    import importlib

    from ready import fastops

    kernel = importlib.import_module(f"ready_kernels.{'rope' if op == 'rope_store' else op}")
    tgt = tiny_target().cuda().to(torch.bfloat16)
    fused, plain = (drafter_for(tgt, head=head, inject_layers=[0, -1]).cuda().to(torch.bfloat16) for _ in range(2))
    torch.nn.init.normal_(fused.markov_head.markov_w2.weight, std=0.5)  # a bias that changes tokens
    plain.load_state_dict(fused.state_dict())
    fused.cuda_graphs = plain.cuda_graphs = None  # captured
    ops = fastops.drafting_ops()
    assert ops is not None and getattr(ops, op) is getattr(kernel, op)
    got = list(_rounds(tgt, [fused]))
    monkeypatch.setattr(fastops, "_DRAFTING", ops._replace(**{op: getattr(kernel, f"{op}_reference")}))
    want = list(_rounds(tgt, [plain]))
    for ((tg, lg),), ((tw, lw),) in zip(got, want):
        assert torch.equal(tg, tw) and torch.equal(lg, lw)
    assert fused._graphs and all(g.graph is not None for g in fused._graphs)


def test_buffers_made_in_inference_mode_serve_later_drafts_outside_it(target):
    """The engine drafts under inference mode; tests and tools also draft outside it."""
    eager, static = _pair(target)
    ids = torch.randint(0, V, (1, 14), device=DEVICE)
    step = draft_step(target, static, ids)
    with torch.inference_mode():
        static.begin(ids)
        first = static.draft(step)[1]
    static.begin(ids)
    torch.testing.assert_close(static.draft(step)[1], first)


def test_the_least_recently_used_step_goes_first(target):
    """Own cache, then two donor caches in turn: the own cache's step, used in between, stays."""
    _, static = _pair(target)
    ids = torch.randint(0, V, (1, 14), device=DEVICE)
    own = draft_step(target, static, ids)
    donors = [draft_step(target, static, torch.randint(0, V, (1, 14), device=DEVICE)).cache for _ in range(2)]
    static.begin(ids)
    for cache in (own.cache, donors[0], own.cache, donors[1]):
        static.draft(DraftStep(tokens=own.tokens, features=own.features, target=target, cache=cache))
    assert [g.cache() for g in static._graphs] == [donors[1], own.cache]
