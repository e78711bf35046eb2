"""Drafter parts: paper layer ids mapped by relative depth, and the sequence heads' conditioning."""

import pytest
import torch

from ready.drafter.heads import build_head
from ready.drafter.layer_map import (PAPER_LAYER_TYPES, LayerMapError, map_context_layers, map_inject_layers,
                                     map_state_layers)


def layout(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def test_paper_ids_are_themselves_on_a_64_layer_target():
    assert map_state_layers([2, 30, 62], PAPER_LAYER_TYPES) == [2, 30, 62]
    assert map_context_layers([1, 9, 17, 25, 33, 62], 64) == [1, 9, 17, 25, 33, 62]


def test_paper_ids_map_to_the_nearest_gdn_layer_at_the_same_relative_depth():
    # 16 layers: 30/63 of the way is layer 7.14 (attention) -> GDN layer 8; 62 -> 14.76 -> 14; 2 -> 0.48 -> 0
    assert map_state_layers([62, 30, 2], layout(16)) == [0, 8, 14]
    assert map_context_layers([1, 17, 33, 49, 62], 8) == [0, 2, 4, 5, 7]
    # ids that land on the same layer of a shallow target are kept once
    assert map_state_layers([28, 30], layout(4)) == [1]


def test_model_ids_are_taken_as_given():
    assert map_state_layers([5, 1], layout(8), space="model") == [1, 5]
    assert map_context_layers([7, 3], 8, space="model") == [3, 7]
    with pytest.raises(LayerMapError, match="layer id space 'gdn' is unknown"):
        map_state_layers([1], layout(8), space="gdn")


def test_context_id_minus_one_names_the_token_embeddings_in_either_space():
    assert map_context_layers([-1], 8) == [-1]
    assert map_context_layers([62, -1], 8) == [-1, 7]
    assert map_context_layers([-1, 3], 8, space="model") == [-1, 3]
    with pytest.raises(LayerMapError, match=r"model layer id -2 is out of range.*or -1 for the token embeddings"):
        map_context_layers([-2], 8, space="model")


def test_injection_layers_count_from_the_end_when_negative():
    assert map_inject_layers([-1], 5) == [4]
    assert map_inject_layers([0, -1, 4], 5) == [0, 4]
    with pytest.raises(LayerMapError, match=r"draft layer -6 is beyond the drafter's depth \(drafter.num_layers = 5\)"):
        map_inject_layers([-6], 5)


def _inputs(head_kind, V=11, K=4, D=6):
    torch.manual_seed(0)
    head = build_head(head_kind, V, 3, D)
    torch.nn.init.normal_(head.markov_w2.weight)
    return head, torch.randn(2, K, V), torch.randint(0, V, (2, K)), torch.randn(2, K, D)


def test_vanilla_head_adds_a_low_rank_bigram_of_the_previous_token():
    head, base, prev, hid = _inputs("vanilla")
    want = base + head.markov_w1.weight[prev] @ head.markov_w2.weight.T
    torch.testing.assert_close(head.block_logits(base, prev, hid), want)


@pytest.mark.parametrize("kind,sees_older_tokens", [("vanilla", False), ("gated", False), ("rnn", True)])
def test_only_the_rnn_head_remembers_tokens_before_the_previous_one(kind, sees_older_tokens):
    head, base, prev, hid = _inputs(kind)
    out = head.block_logits(base, prev, hid)
    changed = prev.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 11
    out2 = head.block_logits(base, changed, hid)
    assert not torch.allclose(out[:, 0], out2[:, 0])  # position 1 sees its previous token
    assert torch.allclose(out[:, 2], out2[:, 2]) != sees_older_tokens


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_greedy_drafting_is_teacher_forcing_on_its_own_tokens(kind):
    head, base, _, hid = _inputs(kind)
    first = torch.tensor([3, 7])
    toks, logits = head.greedy(base, first, hid)
    assert torch.equal(logits.argmax(-1), toks)
    prev = torch.cat([first[:, None], toks[:, :-1]], dim=1)
    torch.testing.assert_close(head.block_logits(base, prev, hid), logits)


@pytest.mark.parametrize("base_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_a_bf16_head_gives_the_bits_of_the_float32_sum_of_base_and_bias(kind, base_dtype):
    """The drafting head adds its bf16 bias to the LM head's logits (bf16 as the drafter hands them over,
    or float32) in float32, writing each position's logits in place: the bits of
    `base.float() + bias.float()` position by position, and their argmax."""
    head, base, _, hid = _inputs(kind, V=300)
    base = base.to(base_dtype)
    head = head.to(torch.bfloat16)
    first = torch.tensor([3, 7])
    toks, logits = head.greedy(base, first, hid.to(torch.bfloat16))
    state, prev = head.init_state(hid[:, 0].to(torch.bfloat16)), first
    for j in range(base.shape[1]):
        state, bias = head.step(state, prev, hid[:, j].to(torch.bfloat16))
        want = base[:, j].float() + bias.to(torch.float32)
        assert logits.dtype == torch.float32 and torch.equal(logits[:, j], want), j
        prev = want.argmax(-1)
        assert torch.equal(toks[:, j], prev)


def test_a_fresh_head_adds_nothing():
    head = build_head("gated", 11, 3, 6)
    base = torch.randn(1, 4, 11)
    assert torch.equal(head.block_logits(base, torch.zeros(1, 4, dtype=torch.long), torch.randn(1, 4, 6)), base)


def test_no_head_is_dflash_the_backbone_logits_unchanged():
    """drafter.head = none: no parameters, block logits = base, greedy = argmax, sampling draws from warp(base)."""
    from ready.decode.sampling import draw, warp

    head = build_head("none", 11, 0, 6)
    base, prev, hid = torch.randn(2, 4, 11), torch.randint(0, 11, (2, 4)), torch.randn(2, 4, 6)
    assert head.rank == 0 and not list(head.parameters()) and not head.state_dict()
    assert head.block_logits(base, prev, hid) is base
    toks, logits = head.greedy(base, prev[:, 0], hid)
    assert torch.equal(toks, base.argmax(-1)) and torch.equal(logits, base)
    toks, logits = head.greedy(base.bfloat16(), prev[:, 0], hid)  # the LM head's bf16 logits: float32 out
    assert logits.dtype == torch.float32 and torch.equal(logits, base.bfloat16().float())
    u = torch.rand(2, 4)
    toks, q = head.sample(base, prev[:, 0], hid, 0.7, 0.9, u)
    for j in range(4):  # position by position, as the Markov heads draw
        want = warp(base[:, j], 0.7, 0.9)
        torch.testing.assert_close(q[:, j], want)
        assert torch.equal(toks[:, j], draw(want, u[:, j]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_gives_the_bits_and_gradients_of_rotate_half_with_the_sign_in_its_table(dtype):
    """apply_rope folds rotate_half's negation into the sin table (one kernel less per rotation); the
    result must be the plain x cos + [-x2, x1] sin to the bit, forward and backward."""
    from ready.drafter.layers import Rotary, apply_rope

    torch.manual_seed(0)
    rotary = Rotary(64, 1e6)
    pos = torch.randint(0, 40000, (2, 5))
    cos, signed_sin = rotary(pos, dtype)
    ang = pos.float().unsqueeze(-1) * rotary.inv_freq
    ang = torch.cat([ang, ang], dim=-1)
    plain_cos, plain_sin = ang.cos().to(dtype), ang.sin().to(dtype)
    assert torch.equal(cos, plain_cos)

    x = torch.randn(2, 3, 5, 64, dtype=dtype, requires_grad=True)
    x1, x2 = x.chunk(2, dim=-1)
    want = x * plain_cos.unsqueeze(1) + torch.cat([-x2, x1], dim=-1) * plain_sin.unsqueeze(1)
    got = apply_rope(x, cos, signed_sin)
    assert torch.equal(got, want)
    g = torch.randn_like(want)
    (grad_want,) = torch.autograd.grad(want, x, g)
    (grad_got,) = torch.autograd.grad(got, x, g)
    assert torch.equal(grad_got, grad_want)
