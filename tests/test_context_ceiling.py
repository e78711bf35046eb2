"""The context ceiling counts the positions where the target's greedy token needs text beyond a window."""

from __future__ import annotations

import pytest
import torch

from benchmarks.diagnostics.context_ceiling import greedy_change_rate, rejection_share
from ready.train import greedy_responses
from test_train_helpers import micro_prompts, micro_target


@pytest.fixture(scope="module")
def regenerated():
    target = micro_target()
    return target, greedy_responses(target, micro_prompts(6, 12), 10, eos_id=None, batch_size=6, progress=False)


def test_a_window_that_holds_every_prefix_changes_nothing(regenerated):
    target, data = regenerated
    rate, n = greedy_change_rate(target, data, window=int(data.tokens.shape[1]))
    assert n == 6 * 10 and rate == 0.0


def test_a_one_token_window_changes_some_greedy_tokens(regenerated):
    target, data = regenerated
    short, _ = greedy_change_rate(target, data, window=1)
    assert 0.0 < short <= 1.0


def test_the_count_matches_a_position_by_position_recount(regenerated):
    target, data = regenerated
    w, changed, n = 5, 0, 0
    with torch.no_grad():
        for i in range(len(data)):
            seq = data.tokens[i, : int(data.lengths[i])]
            for t in range(data.prompt_len - 1, seq.numel() - 1):
                full = target(seq[None, : t + 1]).logits[0, -1].argmax()
                cut = target(seq[None, max(0, t + 1 - w): t + 1]).logits[0, -1].argmax()
                changed += int(full != cut)
                n += 1
    assert greedy_change_rate(target, data, window=w) == (pytest.approx(changed / n), n)


def test_a_window_below_one_is_refused(regenerated):
    target, data = regenerated
    with pytest.raises(ValueError, match="window 0"):
        greedy_change_rate(target, data, window=0)


def test_an_untrained_drafters_rejections_are_its_anchor_positions(regenerated):
    # a drafter that accepts nothing rejects its first draft at every anchor: both shares count the
    # same positions, so they must agree; a window holding every prefix makes both zero
    from ready.config import merge, schema
    from ready.drafter import DSparkDrafter

    target, data = regenerated
    cfg = merge(schema(), {"drafter": {"proposals": 4, "num_layers": 1, "head_rank": 8}})
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg.drafter, cfg.reader, target).eval()
    r = rejection_share(drafter, target, data, window=3)
    assert r["anchors"] > 0 and r["rejections"] == r["anchors"]
    assert r["rejection_share"] == pytest.approx(r["anchor_share"]) and 0 < r["anchor_share"] <= 1
    whole = rejection_share(drafter, target, data, window=int(data.tokens.shape[1]))
    assert whole["anchor_share"] == 0.0 and whole["rejection_share"] == 0.0


def test_cutting_only_attention_to_a_window_that_holds_every_prefix_changes_nothing(regenerated):
    from benchmarks.diagnostics.context_ceiling import attention_only_change_rate, attention_window

    target, data = regenerated
    assert attention_only_change_rate(target, data, window=int(data.tokens.shape[1])) == (0.0, 6 * 10)
    seq = data.tokens[0]
    with torch.no_grad():
        whole = target(seq[None]).logits
        with attention_window(target, 2):
            cut = target(seq[None]).logits
        again = target(seq[None]).logits
    assert not torch.equal(whole, cut)  # the window reached the attention layers
    assert torch.equal(whole, again)  # and was undone on leaving
    # a window of 1 keeps the first query's only key: its logits are untouched
    with torch.no_grad(), attention_window(target, 1):
        first = target(seq[None, :1]).logits
    assert torch.allclose(first, whole[:, :1], atol=1e-6)
