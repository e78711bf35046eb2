"""The training loss and the anchor sampler, against hand computations."""

import math

import pytest
import torch

from ready.train.anchors import gather_blocks, sample_anchors
from ready.train.loss import (confidence_label, draft_loss, loss_share, position_weight_sum, position_weights,
                              terms_from_stats)


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def test_position_weights_decay_as_exp_minus_j_over_gamma():
    w = position_weights(3, gamma=4.0)
    assert torch.allclose(w, torch.tensor([math.exp(-1 / 4), math.exp(-2 / 4), math.exp(-3 / 4)]))


def test_loss_equals_ce_plus_lambda_l1_with_position_weights_by_hand():
    draft = [[2.0, 0.5, -1.0], [0.0, 1.0, 0.0], [-0.5, 0.3, 1.2]]  # K=3 positions, V=3
    target = [[1.0, 1.0, 0.0], [0.2, 2.0, -1.0], [3.0, 0.0, 0.0]]
    labels = [0, 1, 2]
    lam, gamma = 0.3, 2.0
    w = [math.exp(-j / gamma) for j in (1, 2, 3)]
    ce = [-math.log(_softmax(draft[j])[labels[j]]) for j in range(3)]
    l1 = [sum(abs(p - q) for p, q in zip(_softmax(draft[j]), _softmax(target[j]))) for j in range(3)]
    want_ce = sum(wj * c for wj, c in zip(w, ce)) / sum(w)
    want_l1 = sum(wj * d for wj, d in zip(w, l1)) / sum(w)

    terms = draft_loss(torch.tensor([[draft]]), torch.tensor([[labels]]), torch.tensor([[target]]), None, lam, gamma)
    assert terms.ce == pytest.approx(want_ce, rel=1e-5)
    assert terms.l1 == pytest.approx(want_l1, rel=1e-5)
    assert float(terms.loss) == pytest.approx(want_ce + lam * want_l1, rel=1e-5)
    # argmax hits: pos1 (0 == 0), pos2 (1 == 1), pos3 (2 == 2) -> whole block accepted
    assert terms.accuracy == 1.0 and terms.tau_hat == 4.0


def test_confidence_head_loss_is_dspark_bce_against_the_acceptance_rate_by_hand():
    """DeepSpec's confidence loss (its label at temperature 1, the temperature it decodes at): BCE(logit_j, r_j)
    with r_j = 1 - L1_j / 2 (detached), weighted by w_j and normalised like the other terms, times the
    confidence weight."""
    draft = [[2.0, 0.5, -1.0], [0.0, 1.0, 0.0], [-0.5, 0.3, 1.2]]
    target = [[1.0, 1.0, 0.0], [0.2, 2.0, -1.0], [3.0, 0.0, 0.0]]
    labels, z = [0, 1, 2], [1.5, -0.3, 0.2]
    lam, gamma, alpha = 0.3, 2.0, 0.7
    w = [math.exp(-j / gamma) for j in (1, 2, 3)]
    ce = [-math.log(_softmax(draft[j])[labels[j]]) for j in range(3)]
    l1 = [sum(abs(p - q) for p, q in zip(_softmax(draft[j]), _softmax(target[j]))) for j in range(3)]
    r = [1 - d / 2 for d in l1]
    sig = [1 / (1 + math.exp(-x)) for x in z]
    bce = [-(rj * math.log(sj) + (1 - rj) * math.log(1 - sj)) for rj, sj in zip(r, sig)]
    mean = lambda xs: sum(wj * x for wj, x in zip(w, xs)) / sum(w)  # noqa: E731
    logits = torch.tensor([[z]], requires_grad=True)
    d = torch.tensor([[draft]], requires_grad=True)
    terms = draft_loss(d, torch.tensor([[labels]]), torch.tensor([[target]]), None, lam, gamma,
                       confidence_logits=logits, confidence_weight=alpha, confidence_temperature=1.0)
    assert terms.confidence == pytest.approx(mean(bce), rel=1e-5)
    assert terms.confidence_error == pytest.approx(mean([abs(s - x) for s, x in zip(sig, r)]), rel=1e-5)
    assert float(terms.loss.detach()) == pytest.approx(mean(ce) + lam * mean(l1) + alpha * mean(bce), rel=1e-5)
    assert terms.value == pytest.approx(float(terms.loss), rel=1e-6)
    terms.loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    # the acceptance rate is a detached target: the confidence term alone sends nothing into the draft logits
    d2 = torch.tensor([[draft]], requires_grad=True)
    only = draft_loss(d2, torch.tensor([[labels]]), torch.tensor([[target]]), None, 0.0, gamma,
                      confidence_logits=torch.tensor([[z]]), confidence_weight=1.0)
    only.loss.backward()
    plain = torch.tensor([[draft]], requires_grad=True)
    draft_loss(plain, torch.tensor([[labels]]), torch.tensor([[target]]), None, 0.0, gamma).loss.backward()
    assert torch.allclose(d2.grad, plain.grad)
    assert math.isnan(draft_loss(d.detach(), torch.tensor([[labels]]), torch.tensor([[target]])).confidence)


def test_under_greedy_decoding_the_head_learns_whether_the_drafts_argmax_is_the_targets():
    """Greedy verification accepts draft j exactly when the drafter's argmax is the target's, however flat
    the target is; the head's label at temperature 0 (the default, as eval.temperature's) is that event, not
    DeepSpec's 1 - L1/2, the acceptance rate of sampling at temperature 1. On a diffuse target the two are
    far apart: here the first draft is the target's greedy token (label 1, though 1 - L1/2 = 0.44) and the
    second is not (label 0, though 1 - L1/2 = 0.36)."""
    draft = [[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0]]
    target = [[0.3, 0.0, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]]  # diffuse: its top token holds 0.31 of the mass
    labels, z, gamma = [0, 0], [0.4, -0.2], 4.0
    w = [math.exp(-j / gamma) for j in (1, 2)]
    sampled = [1 - sum(abs(p - q) for p, q in zip(_softmax(draft[j]), _softmax(target[j]))) / 2 for j in range(2)]
    assert sampled == pytest.approx([0.44, 0.36], abs=0.005)
    sig = [1 / (1 + math.exp(-x)) for x in z]
    want = (w[0] * -math.log(sig[0]) + w[1] * -math.log(1 - sig[1])) / sum(w)  # BCE against labels 1, 0
    args = (torch.tensor([[draft]]), torch.tensor([[labels]]), torch.tensor([[target]]), None, 0.1, gamma)
    terms = draft_loss(*args, confidence_logits=torch.tensor([[z]]))
    assert terms.confidence == pytest.approx(want, rel=1e-5)
    assert terms.confidence_error == pytest.approx((w[0] * (1 - sig[0]) + w[1] * sig[1]) / sum(w), rel=1e-5)
    assert draft_loss(*args, confidence_logits=torch.tensor([[z]]), confidence_temperature=0.0).confidence == \
        pytest.approx(want, rel=1e-6)
    assert confidence_label(torch.tensor(draft), torch.tensor(target)).tolist() == [1.0, 0.0]


def test_at_temperature_t_the_confidence_label_is_one_minus_tv_of_the_tempered_distributions():
    """Speculative sampling at temperature T accepts a draft with probability 1 - TV(p_draft^T, p_target^T):
    the label at T = 1 is DeepSpec's, and it tends to the greedy event as T goes to 0."""
    draft = [[2.0, 0.5, -1.0], [0.0, 1.0, 0.0]]
    target = [[1.0, 1.2, 0.0], [0.2, 2.0, -1.0]]
    for t in (0.5, 1.0, 2.0):
        want = [1 - sum(abs(p - q) for p, q in zip(_softmax([x / t for x in draft[j]]),
                                                    _softmax([x / t for x in target[j]]))) / 2 for j in range(2)]
        got = confidence_label(torch.tensor(draft), torch.tensor(target), t)
        assert got.tolist() == pytest.approx(want, rel=1e-5)
    assert confidence_label(torch.tensor(draft), torch.tensor(target), 1e-3).tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        confidence_label(torch.tensor(draft), torch.tensor(target), -1.0)


def test_micro_batch_shares_with_the_confidence_term_add_up_to_the_whole_batch():
    g = torch.Generator().manual_seed(1)
    d, t = torch.randn(4, 2, 3, 6, generator=g), torch.randn(4, 2, 3, 6, generator=g)
    z, labels = torch.randn(4, 2, 3, generator=g), torch.randint(0, 6, (4, 2, 3), generator=g)
    mask = torch.rand(4, 2, 3, generator=g) > 0.2
    whole = draft_loss(d, labels, t, mask, 0.1, 4.0, confidence_logits=z, confidence_weight=1.0)
    ws = position_weight_sum(mask, 4.0)
    parts = [loss_share(d[s], labels[s], t[s], mask[s], ws, 0.1, 4.0, confidence_logits=z[s]) for s in (slice(0, 1), slice(1, 4))]
    total = sum(p[0] for p in parts)
    terms = terms_from_stats(total, sum(p[1] for p in parts), 0.1, 1.0)
    assert float(total) == pytest.approx(float(whole.loss), rel=1e-5)
    assert terms.confidence == pytest.approx(whole.confidence, rel=1e-5)
    assert terms.value == pytest.approx(whole.value, rel=1e-5)


def test_masked_positions_do_not_count():
    g = torch.Generator().manual_seed(0)
    d, t = torch.randn(1, 1, 3, 5, generator=g), torch.randn(1, 1, 3, 5, generator=g)
    labels = torch.tensor([[[1, 2, 3]]])
    full = draft_loss(d[..., :2, :], labels[..., :2], t[..., :2, :], None, 0.1, 4.0)
    mask = torch.tensor([[[True, True, False]]])
    d2 = d.clone()
    d2[..., 2, :] = 100.0  # garbage at the masked position must not matter
    masked = draft_loss(d2, labels, t, mask, 0.1, 4.0)
    assert float(masked.loss) == pytest.approx(float(full.loss), rel=1e-6)


def test_loss_gradient_reaches_draft_logits_only():
    d = torch.randn(2, 2, 3, 7, requires_grad=True)
    t = torch.randn(2, 2, 3, 7, requires_grad=True)
    draft_loss(d, torch.zeros(2, 2, 3, dtype=torch.long), t).loss.backward()
    assert d.grad is not None and d.grad.abs().sum() > 0
    assert t.grad is None


def response(lengths: torch.Tensor, prompt_len: int, T: int = 20) -> torch.Tensor:
    """The trainable tokens of prompt + response rows: the response up to each row's length."""
    pos = torch.arange(T).unsqueeze(0)
    return (pos >= prompt_len) & (pos < lengths.unsqueeze(1))


def test_anchors_lie_in_the_response_and_labels_past_the_end_are_masked():
    lengths = torch.tensor([20, 14, 20])  # row 1 ended with EOS at index 13
    g = torch.Generator().manual_seed(3)
    anchors, mask = sample_anchors(response(lengths, 8), proposals=4, num_anchors=5, generator=g)
    assert anchors.shape == (3, 5) and mask.shape == (3, 5, 4)
    lo, hi = 7, lengths - 2  # first label in the response, and a real token
    for b in range(3):
        kept = anchors[b][mask[b, :, 0]]
        assert len(set(kept.tolist())) == len(kept)  # distinct
        assert bool((kept >= lo).all()) and bool((kept <= hi[b]).all())
        for a_i, a in enumerate(anchors[b].tolist()):
            if mask[b, a_i, 0]:
                for j in range(4):
                    assert bool(mask[b, a_i, j]) == (a + j + 1 < int(lengths[b]))
    # row 1 has anchors 7..12 only: 6 candidates >= 5, all kept
    assert bool(mask[1, :, 0].all())


def test_too_few_anchor_candidates_are_padded_and_masked():
    g = torch.Generator().manual_seed(0)
    anchors, mask = sample_anchors(response(torch.tensor([10]), 8), proposals=3, num_anchors=4, generator=g)
    # valid anchors: 7 and 8 (first label 8, 9 < 10)
    assert sorted(anchors[0][mask[0, :, 0]].tolist()) == [7, 8]
    assert int(mask[0, :, 0].sum()) == 2


def test_anchor_draws_repeat_with_the_same_generator_seed():
    trainable = response(torch.full((4,), 30), 10, T=30)
    a1, _ = sample_anchors(trainable, 4, 6, torch.Generator().manual_seed(11))
    a2, _ = sample_anchors(trainable, 4, 6, torch.Generator().manual_seed(11))
    assert torch.equal(a1, a2)


def test_in_a_conversation_anchors_start_assistant_labels_and_user_turns_are_never_labels():
    #          system/user template  | assistant 1 | user 2     | assistant 2
    trainable = torch.tensor([[0] * 6 + [1] * 5 + [0] * 4 + [1] * 5]).bool()  # T = 20
    anchors, mask = sample_anchors(trainable, proposals=3, num_anchors=20, generator=torch.Generator().manual_seed(1))
    kept = anchors[0][mask[0, :, 0]].tolist()
    assert sorted(kept) == [5, 6, 7, 8, 9, 14, 15, 16, 17, 18]  # every a with token a+1 from the assistant
    for i, a in enumerate(anchors[0].tolist()):
        if mask[0, i, 0]:
            assert mask[0, i].tolist() == [bool(trainable[0, a + j]) if a + j < 20 else False for j in (1, 2, 3)]


def test_gather_blocks_takes_labels_and_the_teacher_positions_that_predict_them():
    tokens = torch.arange(100, 112).view(1, 12)
    anchors = torch.tensor([[3, 7]])
    labels = gather_blocks(tokens, anchors, 3, offset=1)
    assert labels.tolist() == [[[104, 105, 106], [108, 109, 110]]]
    logits = torch.arange(12).view(1, 12, 1).float().expand(1, 12, 2)
    teacher = gather_blocks(logits, anchors, 3, offset=0)
    assert teacher[0, :, :, 0].tolist() == [[3, 4, 5], [7, 8, 9]]
