"""The hybrid target: parity with transformers, cache semantics, chunked == recurrent, clear errors."""

import json

import pytest
import torch

from ready.target import HybridLM, TargetError, load_target, preset_config, save_target
from ready.target.gdn_ops import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule


def small_config(**kw):
    base = dict(
        vocab_size=97, num_hidden_layers=4, hidden_size=64, intermediate_size=96, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    base.update(kw)
    return preset_config("tiny", base)


def random_model(**kw) -> HybridLM:
    m = HybridLM(small_config(**kw)).eval()
    with torch.no_grad():  # move norms and gates off their init so parity checks see them
        for name, p in m.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    return random_model()


@pytest.mark.parametrize("value_heads", [2, 4])  # equal and grouped value heads
def test_logits_match_transformers_both_ways(tmp_path, value_heads):
    transformers = pytest.importorskip("transformers")
    ours = random_model(linear_num_value_heads=value_heads)
    ids = torch.randint(0, 97, (2, 75))  # crosses a 64-token chunk boundary
    save_target(ours, tmp_path / "ours")
    theirs = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    with torch.no_grad():
        ref = theirs(ids).logits
        assert torch.allclose(ours(ids).logits, ref, atol=1e-4)
        theirs.save_pretrained(tmp_path / "theirs")
        back = load_target(tmp_path / "theirs")
        assert torch.allclose(back(ids).logits, ref, atol=1e-4)


def test_loads_multimodal_config_with_text_config(tmp_path, model):
    save_target(model, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": cfg}))
    ids = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        assert torch.allclose(load_target(tmp_path / "m")(ids).logits, model(ids).logits, atol=1e-6)


def test_capture_id_minus_one_is_the_token_embeddings_on_every_path(model):
    """Capture id -1 (EMBEDDINGS) returns what layer 0 reads, beside layer outputs, in the full
    forward and the cached prefill / verify alike."""
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        full = model(ids, capture_layers=[-1, 2])
        torch.testing.assert_close(full.hidden[:, :, 0], model.model.embed_tokens(ids))
        cache = model.new_cache(batch_size=2, max_len=64)
        pre = model.prefill(ids[:, :7], cache, capture_layers=[-1, 2])
        ver = model.verify(ids[:, 7:], cache, capture_layers=[-1, 2])
    torch.testing.assert_close(torch.cat([pre.hidden, ver.hidden], dim=1), full.hidden, rtol=1e-5, atol=1e-5)
    with pytest.raises(TargetError, match=r"capture layer ids \[-2\] out of range.*-1 for the token embeddings"):
        model(ids, capture_layers=[-2])


def test_prefill_then_steps_equal_one_full_forward(model):
    ids = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(batch_size=2, max_len=64)
        out = model.prefill(ids[:, :17], cache)
        assert torch.allclose(out.logits, full[:, :17], atol=1e-5)
        for t in range(17, 30):
            step = model.step(ids[:, t : t + 1], cache)
            assert torch.allclose(step.logits[:, 0], full[:, t], atol=1e-5)
    assert cache.length == 30


def test_a_prefill_asked_for_the_last_logits_only_returns_those_and_the_same_cache(model):
    ids = torch.randint(0, 97, (2, 21))
    with torch.no_grad():
        full_cache, last_cache = model.new_cache(batch_size=2, max_len=32), model.new_cache(batch_size=2, max_len=32)
        full = model.prefill(ids, full_cache, capture_layers=[1])
        last = model.prefill(ids, last_cache, capture_layers=[1], last_logits_only=True)
    assert last.logits.shape == (2, 1, 97)
    assert torch.allclose(last.logits[:, 0], full.logits[:, -1], atol=1e-5)
    assert torch.equal(last.hidden, full.hidden)
    assert torch.equal(last_cache.ssm, full_cache.ssm) and last_cache.length == full_cache.length == 21


@pytest.mark.parametrize("static", [False, True])  # the dynamic cache and the CUDA-graph layout
@pytest.mark.parametrize("last_only", [False, True])
def test_a_prefill_in_chunks_gives_the_cache_and_outputs_of_one_pass(model, static, last_only):
    """`prefill_chunk`: a long prompt as consecutive continuations (the last piece shorter) leaves the
    cache one pass leaves, returns the same logits and features, and the next step sees the same."""
    ids = torch.randint(0, 97, (2, 45))
    runs = []
    try:
        for chunk in (0, 16):
            model.prefill_chunk = chunk
            cache = model.new_cache(batch_size=2, max_len=64)
            cache.static = static
            with torch.no_grad():
                out = model.prefill(ids, cache, capture_layers=[1, 3], last_logits_only=last_only)
                step = model.step(torch.randint(0, 97, (2, 1), generator=torch.Generator().manual_seed(0)), cache)
            runs.append((out, cache, step))
    finally:
        model.prefill_chunk = 0
    (one, c1, s1), (chunked, c2, s2) = runs
    assert chunked.logits.shape == one.logits.shape == (2, 1 if last_only else 45, 97)
    assert torch.allclose(chunked.logits, one.logits, atol=1e-5)
    assert torch.allclose(chunked.hidden, one.hidden, atol=1e-5)
    assert c1.length == c2.length == 46
    for a, b in ((c1.ssm, c2.ssm), (c1.conv, c2.conv), (c1.key[:, :, :, :46], c2.key[:, :, :, :46]),
                 (c1.value[:, :, :, :46], c2.value[:, :, :, :46]), (s1.logits, s2.logits)):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_negative_prefill_chunk_is_one_clear_error(model):
    model.prefill_chunk = -1
    try:
        with pytest.raises(TargetError, match=r"prefill_chunk=-1; expected 0 \(one pass\) or a number of tokens >= 1"):
            model.prefill(torch.randint(0, 97, (1, 5)), model.new_cache(max_len=8))
    finally:
        model.prefill_chunk = 0


@pytest.mark.parametrize("k", range(0, 6))
def test_verify_then_commit_k_equals_forward_over_accepted_prefix(model, k):
    K = 5
    prompt = torch.randint(0, 97, (1, 12))
    block = torch.randint(0, 97, (1, K + 1))
    nxt = torch.randint(0, 97, (1, 1))
    with torch.no_grad():
        cache = model.new_cache(max_len=64)
        model.prefill(prompt, cache)
        live_before = cache.ssm.clone()
        ver = model.verify(block, cache)
        assert torch.equal(cache.ssm, live_before), "verify must leave the live state untouched"
        model.commit(cache, k + 1)
        after = model.step(nxt, cache).logits[:, 0]
        ref_ids = torch.cat([prompt, block[:, : k + 1], nxt], dim=1)
        ref = model(ref_ids).logits
    assert torch.allclose(ver.logits, model(torch.cat([prompt, block], 1)).logits[:, 12:], atol=1e-5)
    assert torch.allclose(after, ref[:, -1], atol=1e-5)
    assert cache.length == 12 + k + 2


@pytest.mark.parametrize("T", [1, 8])
def test_verify_conv_as_a_tap_sum_equals_conv1d(model, T):
    gdn = next(layer.linear_attn for layer in model.model.layers if layer.layer_type == "linear_attention")
    mixed = torch.randn(2, T, gdn.conv_dim)
    prefix = torch.randn(2, gdn.conv_dim, gdn.kernel - 1)
    with torch.no_grad():
        want, want_full = gdn._conv(mixed, prefix)
        got, got_full = gdn._conv(mixed, prefix, taps=True)
    assert torch.equal(got_full, want_full)
    assert torch.allclose(got, want, atol=1e-6)


def test_committed_states_are_views_of_the_cache(model):
    cache = model.new_cache(max_len=32)
    model.prefill(torch.randint(0, 97, (1, 8)), cache)
    gdn = model.gdn_layer_ids
    states = model.committed_states(cache, gdn[:2])
    assert states.data_ptr() == cache.ssm.data_ptr()
    assert states.shape == (2, 1, 4, 16, 16)


def test_states_at_positions_match_incremental_decoding(model):
    ids = torch.randint(0, 97, (1, 20))
    layers = model.gdn_layer_ids[-2:]
    pos = torch.tensor([[3, 11, 19]])
    out = model(ids, state_layers=layers, state_positions=pos)
    cache = model.new_cache(max_len=32)
    for i, p in enumerate(pos[0].tolist()):
        cache.reset()
        model.prefill(ids[:, : p + 1], cache)
        expect = model.committed_states(cache, layers)[:, 0]
        assert torch.allclose(out.states[0, i], expect, atol=1e-5)


def test_chunked_gradients_match_recurrent():
    B, H, T, dk, dv = 1, 2, 21, 8, 8
    leaves = [torch.randn(B, H, T, dk), torch.randn(B, H, T, dk), torch.randn(B, H, T, dv),
              torch.randn(B, H, T), torch.randn(B, H, T)]
    for x in leaves:
        x.requires_grad_(True)

    def run(fn):
        q, k, v, a, b = leaves
        args = (l2norm(q) * dk**-0.5, l2norm(k), v, -torch.nn.functional.softplus(a), b.sigmoid())
        o, S = fn(*args)[:2]
        (o.square().sum() + S.square().sum()).backward()
        grads = [x.grad.clone() for x in leaves]
        for x in leaves:
            x.grad = None
        return grads

    chunked = run(lambda *a: chunk_gated_delta_rule(*a, chunk_size=8))
    recurrent = run(recurrent_gated_delta_rule)
    for gc, gr in zip(chunked, recurrent):
        assert torch.allclose(gc, gr, atol=1e-4)


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(TargetError, match="neither a preset"):
        load_target(tmp_path / "nope")


def test_llama_config_is_rejected_naming_expected_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(TargetError, match="model_type is 'llama'.*qwen3_5_text"):
        load_target(tmp_path)


def test_state_read_from_attention_layer_lists_gdn_ids(model):
    cache = model.new_cache(max_len=16)
    attn = model.attn_layer_ids[0]
    with pytest.raises(TargetError, match=r"not a Gated DeltaNet layer.*\[0, 1, 2\]"):
        model.committed_states(cache, [attn])


def test_commit_outside_pending_range_is_rejected(model):
    cache = model.new_cache(max_len=16)
    model.prefill(torch.randint(0, 97, (1, 4)), cache)
    model.verify(torch.randint(0, 97, (1, 3)), cache)
    with pytest.raises(TargetError, match="expected 1..3"):
        model.commit(cache, 4)


def test_a_cpu_commit_installs_the_state_a_replay_of_the_kept_tokens_reaches(model):
    """Without the Triton kernels the verify keeps each token's state and the commit copies the one
    after row b's n[b]-th token: the state the kernels' replay reference reaches from the live state."""
    from ready.target.ragged import new_ragged_cache, prefill_row, ragged_commit, ragged_verify
    from ready_kernels.gdn_verify import gdn_commit_reference

    cache = new_ragged_cache(model, 3, 64, max_verify=8)
    assert cache.pending_states is not None
    for b, n in enumerate((5, 9, 7)):
        prefill_row(model, cache, b, torch.randint(0, 97, (n,)))
    ragged_verify(model, torch.randint(0, 97, (3, 5)), cache)
    counts = torch.tensor([1, 3, 5])
    want_ssm, want_conv = cache.ssm.clone(), cache.conv.clone()
    gdn_commit_reference(want_ssm, cache.pending_inputs, counts, want_conv, cache.pending_conv)
    ragged_commit(model, cache, counts)
    torch.testing.assert_close(cache.ssm, want_ssm, rtol=1e-5, atol=1e-6)
    assert torch.equal(cache.conv, want_conv)


def test_a_cache_without_kept_states_cannot_commit_where_there_is_no_replay_kernel():
    from ready.target.cache import HybridCache

    m = random_model()
    cache = HybridCache.allocate(m.config, 1, 32, 4, keep_states=False)
    m.prefill(torch.randint(0, 97, (1, 4)), cache)
    m.verify(torch.randint(0, 97, (1, 3)), cache)
    with pytest.raises(TargetError, match="keep_states=True"):
        m.commit(cache, 2)


def test_prompt_longer_than_cache_is_rejected(model):
    cache = model.new_cache(max_len=8)
    with pytest.raises(TargetError, match="exceed the cache's 8-token context"):
        model.prefill(torch.randint(0, 97, (1, 9)), cache)


def test_static_cache_mode_gives_the_same_tokens_as_dynamic(model):
    """The CUDA-graph layout (whole-buffer attention, device positions) changes no number."""
    prompt, block = torch.randint(0, 97, (1, 10)), torch.randint(0, 97, (1, 4))
    outs = []
    for static in (False, True):
        cache = model.new_cache(max_len=32)
        cache.static = static
        model.prefill(prompt, cache)
        first = model.verify(block, cache).logits
        model.commit(cache, 2)
        second = model.verify(block, cache).logits
        outs.append((first, second))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_a_pass_computes_its_rotary_inputs_once_and_each_layer_would_compute_the_same(monkeypatch, static):
    """The pass's positions, cos and sin are computed once for all attention layers (each layer's own
    fused transcendentals cost the 27B verify ~0.2 ms on the H200); a layer left to compute them
    itself (rope=None) gets the same numbers, on the dynamic and the static (CUDA-graph) cache."""
    import ready.target.layers as layers

    torch.manual_seed(2)
    model = random_model(num_hidden_layers=8)  # two attention layers
    calls = []
    real = layers.rotary
    monkeypatch.setattr(layers, "rotary", lambda *a, **kw: (calls.append(a[0].clone()), real(*a, **kw))[1])
    prompt, block = torch.randint(0, 97, (1, 10)), torch.randint(0, 97, (1, 4))
    cache = model.new_cache(max_len=32)
    cache.static = static
    with torch.no_grad():
        model.prefill(prompt, cache)
        calls.clear()
        hoisted = model.verify(block, cache).logits
        cache.pending = 0
        assert len(model.config.attn_layer_ids) == 2 and len(calls) == 1
        assert calls[0].tolist() == list(range(10, 14))  # the block's absolute positions
        monkeypatch.setattr(model, "_pass_rope", lambda *a: None)  # every layer computes its own
        per_layer = model.verify(block, cache).logits
    assert torch.equal(hoisted, per_layer)


@pytest.mark.cuda
def test_graphed_verify_replays_match_eager_on_cuda():
    from ready.target import GraphedVerify

    torch.manual_seed(0)
    m = random_model().cuda()
    prompt, block = torch.randint(0, 97, (1, 10), device="cuda"), torch.randint(0, 97, (1, 4), device="cuda")
    ref_cache = m.new_cache(max_len=64)
    m.prefill(prompt, ref_cache)
    ref = m.verify(block, ref_cache).logits.clone()
    cache = m.new_cache(max_len=64)
    m.prefill(prompt, cache)
    graphed = GraphedVerify(m, cache, tokens=4)
    assert torch.allclose(graphed(block).logits, ref, atol=1e-4)


@pytest.mark.cuda
def test_a_prefill_in_chunks_on_cuda_in_bf16_is_as_close_to_fp32_as_one_pass():
    """On CUDA in bf16 the prefill runs fla's chunked GDN (where installed) from the cache's state for every
    piece after the first: the chunked prefill is no farther from the fp32 one-pass reference than the bf16
    one pass is (a piece that ignored the state before it would be far off)."""
    torch.manual_seed(0)
    ref_model = random_model().cuda()
    ids = torch.randint(0, 97, (2, 200), device="cuda")
    with torch.no_grad():
        ref_cache = ref_model.new_cache(batch_size=2, max_len=256)
        ref = ref_model.prefill(ids, ref_cache, last_logits_only=True).logits
        m = ref_model.to(torch.bfloat16)
        errs = []
        for chunk in (0, 64):
            m.prefill_chunk = chunk
            cache = m.new_cache(batch_size=2, max_len=256)
            out = m.prefill(ids, cache, last_logits_only=True).logits
            errs.append(((out.float() - ref).abs().max().item(), (cache.ssm.float() - ref_cache.ssm.float()).abs().max().item()))
        m.prefill_chunk = 0
    (one_logits, one_ssm), (chunk_logits, chunk_ssm) = errs
    assert chunk_logits <= 2 * one_logits + 1e-2, errs
    assert chunk_ssm <= 2 * one_ssm + 1e-2, errs
