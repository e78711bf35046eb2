"""The drafter's training loss: L = L_CE + λ·L_L1 with position weights w_j = exp(-j/γ).

For every sampled anchor the drafter predicts K draft positions j = 1..K. Each position has
a cross-entropy term against the label token (the target's greedy token) and an L1 term
between the draft and target probability distributions, sum_v |p_draft(v) - p_target(v)|
(twice the total-variation distance, so 1 - L1/2 is the probability that the target accepts
a draft sampled from p_draft). Both terms are weighted means over positions with weights
w_j = exp(-j/γ): early positions matter most because a block is only as long as its
accepted prefix. Positions a mask marks invalid (past the sequence end or after EOS) get
weight 0. Normalising by the weight sum makes the loss independent of whether j starts at
0 or 1.

Data-parallel training (ready.train.distributed): each rank holds a slice of the global batch.
Given `all_reduce` (a sum over the ranks), the weight sum in the denominator is the global
batch's, so each rank's `loss` is its share of the global batch's loss: the ranks' shares add up
to the one-process loss, and so do their gradients. The logged numbers (`value`, `ce`, `l1`,
`accuracy`, `tau_hat`) are the global batch's on every rank.

DSpark's confidence head (`confidence_logits`, the base drafter's training only; DeepSpec
`deepspec/modeling/dspark/loss.py`): its logit at draft position j is trained by binary cross-entropy
against `confidence_label`, the probability that the target accepts draft j given that drafts 1..j-1 were,
under the decoding the head will schedule, at temperature T = `confidence_temperature`
(`train.loss.confidence_temperature`): speculative sampling at T > 0 accepts a draft with probability
1 - TV(p_draft^T, p_target^T) = 1 - L1_j^T / 2, the two distributions' softmaxes at temperature T (DSpark's
label, eq. 8 of its paper, at T = 1: DeepSpec trains and evaluates at temperature 1); greedy verification
(T = 0, the limit) accepts it exactly when the drafter's argmax is the target's, so the label is that
indicator. The label is detached; the terms share the position weights and normaliser, weighted by
`confidence_weight` (DeepSpec's `confidence_head_alpha`). The head's gradient reaches the draft layers'
hidden states and the Markov embedding it reads, as in DeepSpec. Logged beside it: `confidence` (the
weighted BCE) and `confidence_error` (weighted mean |sigmoid - label|).

Why the temperature matters: DeepSpec's T = 1 label predicts the wrong event for greedy verification.
On the embedded default's diffuse target (its top token holds 0.35-0.39 of the mass) a base drafter's
draft j, given its true prefix, is accepted at T = 1 with probability 0.40-0.43 on average but greedily
0.93-0.97 of the time, and a head trained on the T = 1 label learns the former, under-confident by half
under greedy decoding (docs/figures.md, "On the embedded default (CPU): the schedule's effect and the
head's calibration").

Gradient accumulation (`train.micro_batch_size`, ready.train.stages): a process's share runs in
micro-batches. `position_weight_sum` gives the whole batch's weight sum before any forward (it
depends on the mask alone), `loss_share` normalises each micro-batch's weighted sums by it, so the
micro-batches' losses (and gradients) add up to the one-pass loss, and `terms_from_stats` reads the
logged numbers from the micro-batches' summed statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass
class LossTerms:
    """The loss to back-propagate and its parts (detached floats for logging)."""

    loss: torch.Tensor  # scalar, carries the graph (data-parallel: this rank's share of the global loss)
    value: float  # the global batch's loss (= float(loss) in one process)
    ce: float
    l1: float
    accuracy: float  # top-1 agreement with the label, unweighted, over valid positions
    tau_hat: float  # 1 + mean accepted-prefix length if the drafts were verified greedily
    confidence: float = float("nan")  # the confidence head's weighted BCE (nan: no head trained)
    confidence_error: float = float("nan")  # weighted mean |sigmoid(logit) - acceptance rate| (nan: no head)


STATS = 9  # the statistics `_sums` returns (and micro-batches add up): see `terms_from_stats`


def position_weights(proposals: int, gamma: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """w_j = exp(-j/γ) for draft positions j = 1..K, float32 [K]."""
    j = torch.arange(1, proposals + 1, device=device, dtype=torch.float32)
    return torch.exp(-j / float(gamma))


def position_weight_sum(mask: torch.Tensor, gamma: float = 4.0) -> torch.Tensor:
    """The loss's denominator for draft blocks with validity `mask` [..., K]: the sum of w_j over
    valid positions (scalar float32). It needs no forward, so a batch run in micro-batches knows its
    whole normaliser first."""
    w, _ = _weights(mask.shape, mask, gamma, mask.device)
    return w.sum()


def draft_loss(
    draft_logits: torch.Tensor,
    labels: torch.Tensor,
    target_logits: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    l1_weight: float = 0.1,
    gamma: float = 4.0,
    all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    confidence_logits: Optional[torch.Tensor] = None,
    confidence_weight: float = 1.0,
    confidence_temperature: float = 0.0,
) -> LossTerms:
    """L_CE + l1_weight * L_L1 (+ confidence_weight * L_conf) over draft blocks.

    draft_logits, target_logits: [..., K, V]; labels: [..., K]; mask: [..., K] bool (None =
    all valid). target_logits is detached here: the target is a fixed teacher. all_reduce: sums
    a 1-D tensor over data-parallel ranks (module doc); None = this batch is the whole batch.
    confidence_logits [..., K]: DSpark's confidence head, trained against `confidence_label` at
    `confidence_temperature` (module doc).
    """
    ce_sum, l1_sum, conf_sum, stats = _sums(draft_logits, labels, target_logits, mask, gamma, confidence_logits,
                                            confidence_temperature)
    if all_reduce is not None:
        with torch.no_grad():
            stats = all_reduce(stats)
    den = stats[0].clamp_min(1e-12)
    loss = ce_sum / den + float(l1_weight) * (l1_sum / den) + float(confidence_weight) * (conf_sum / den)
    return terms_from_stats(loss, stats, l1_weight, confidence_weight)


def loss_share(
    draft_logits: torch.Tensor,
    labels: torch.Tensor,
    target_logits: torch.Tensor,
    mask: Optional[torch.Tensor],
    weight_sum: torch.Tensor,
    l1_weight: float = 0.1,
    gamma: float = 4.0,
    confidence_logits: Optional[torch.Tensor] = None,
    confidence_weight: float = 1.0,
    confidence_temperature: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's share of a larger batch's loss, and its statistics.

    Returns (loss, stats): `loss` (carries the graph) is this micro-batch's weighted CE and L1 (and
    confidence) sums over `weight_sum`, the whole batch's `position_weight_sum` (all ranks' when
    data-parallel), so the shares' losses and gradients add up to `draft_loss` of the whole batch;
    `stats` [STATS] are detached sums to add over micro-batches (and ranks) and read with `terms_from_stats`.
    """
    ce_sum, l1_sum, conf_sum, stats = _sums(draft_logits, labels, target_logits, mask, gamma, confidence_logits,
                                            confidence_temperature)
    den = weight_sum.clamp_min(1e-12)
    return ce_sum / den + float(l1_weight) * (l1_sum / den) + float(confidence_weight) * (conf_sum / den), stats


def terms_from_stats(loss: torch.Tensor, stats: torch.Tensor, l1_weight: float = 0.1,
                     confidence_weight: float = 1.0) -> LossTerms:
    """The logged numbers of a batch from its summed statistics (`_sums`: weight sum, CE and L1
    numerators, hits, valid positions, accepted-prefix sum, blocks, and the confidence head's BCE and
    absolute-error numerators, or -1 without a head), with `loss` to back-propagate."""
    den = stats[0].clamp_min(1e-12)
    ce_mean, l1_mean = float(stats[1] / den), float(stats[2] / den)
    accuracy = float(stats[3] / stats[4].clamp_min(1))
    tau_hat = float(1 + stats[5] / stats[6]) if float(stats[6]) > 0 else float("nan")
    head = float(stats[7]) >= 0
    conf = float(stats[7] / den) if head else float("nan")
    conf_err = float(stats[8] / den) if head else float("nan")
    value = ce_mean + float(l1_weight) * l1_mean + (float(confidence_weight) * conf if head else 0.0)
    return LossTerms(loss=loss, value=value, ce=ce_mean, l1=l1_mean, accuracy=accuracy, tau_hat=tau_hat,
                     confidence=conf, confidence_error=conf_err)


def _weights(shape: torch.Size, mask: Optional[torch.Tensor], gamma: float,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position weights w_j zeroed at invalid positions, and the validity mask, both of `shape` [..., K]."""
    w = position_weights(shape[-1], gamma, device).expand(shape)
    valid = torch.ones(shape, dtype=torch.bool, device=device) if mask is None else mask.bool()
    return w * valid.float(), valid


def confidence_label(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float = 0.0) -> torch.Tensor:
    """The confidence head's label per draft position [...] (detached, float32 in [0, 1]): the probability
    that the target accepts the draft given its prefix, under the decoding at `temperature` (module doc):
    1{argmax draft = argmax target} at 0 (greedy verification), 1 - TV of the two softmaxes at T > 0
    (speculative sampling; DSpark's label at T = 1). draft_logits, target_logits [..., V]."""
    t = float(temperature)
    if not t >= 0.0:
        raise ValueError(f"confidence_label: temperature {temperature}; expected a number >= 0 (0 = greedy)")
    with torch.no_grad():
        d, p = draft_logits.detach().float(), target_logits.detach().float()
        if t == 0.0:
            return (d.argmax(-1) == p.argmax(-1)).float()
        tv = 0.5 * ((d / t).softmax(-1) - (p / t).softmax(-1)).abs().sum(-1)
        return (1.0 - tv).clamp(0.0, 1.0)


def _sums(draft_logits: torch.Tensor, labels: torch.Tensor, target_logits: torch.Tensor,
          mask: Optional[torch.Tensor], gamma: float,
          confidence_logits: Optional[torch.Tensor] = None,
          confidence_temperature: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted CE, L1 and confidence-BCE sums (with the graph; the last 0 without a head) and the
    detached statistics [STATS] of one batch."""
    if draft_logits.shape != target_logits.shape or draft_logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"draft_loss: shapes disagree: draft logits {tuple(draft_logits.shape)}, target logits "
            f"{tuple(target_logits.shape)}, labels {tuple(labels.shape)}; expected [..., K, V], [..., K, V], [..., K]"
        )
    V = draft_logits.shape[-1]
    w, valid = _weights(labels.shape, mask, gamma, draft_logits.device)

    logits = draft_logits.float()
    ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1).clamp_min(0), reduction="none").view(labels.shape)
    ce_sum = (ce * w).sum()

    p_draft = logits.softmax(-1)
    p_target = target_logits.detach().float().softmax(-1)
    l1 = (p_draft - p_target).abs().sum(-1)
    l1_sum = (l1 * w).sum()

    conf_sum = l1_sum.new_zeros(())
    conf_stats = [torch.full((), -1.0, device=l1.device), torch.full((), -1.0, device=l1.device)]
    if confidence_logits is not None:
        if confidence_logits.shape != labels.shape:
            raise ValueError(f"draft_loss: confidence logits of shape {tuple(confidence_logits.shape)}; expected "
                             f"{tuple(labels.shape)}, one per draft position")
        if float(confidence_temperature) == 1.0:  # the label is 1 - L1/2 of the softmaxes above: no second pass
            rate = (1.0 - 0.5 * l1.detach()).clamp(0.0, 1.0)
        else:
            rate = confidence_label(logits, target_logits, confidence_temperature)
        z = confidence_logits.float()
        conf_sum = (F.binary_cross_entropy_with_logits(z, rate, reduction="none") * w).sum()
        with torch.no_grad():
            conf_stats = [conf_sum.detach(), ((z.sigmoid() - rate).abs() * w).sum()]

    with torch.no_grad():
        hit = (logits.argmax(-1) == labels) & valid
        blocks = valid[..., 0]
        prefix = hit.int().cumprod(-1).sum(-1)
        # weight sum, CE and L1 numerators, hits, valid positions, accepted-prefix sum, blocks,
        # the confidence head's BCE and absolute-error numerators (-1: no head)
        stats = torch.stack([w.sum(), ce_sum.detach(), l1_sum.detach(), hit.sum().float(), valid.sum().float(),
                             prefix[blocks].sum().float(), blocks.sum().float(), *conf_stats])
    return ce_sum, l1_sum, conf_sum, stats
