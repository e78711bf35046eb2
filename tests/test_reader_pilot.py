"""The reader pilot's probe: Δh = 0 and another block's states are what they say, and are undone."""

from __future__ import annotations

import pytest
import torch

from benchmarks.diagnostics.reader_pilot import probe, reader_ablation
from ready.train import greedy_responses
from test_train_helpers import micro_prompts, micro_target


@pytest.fixture(scope="module")
def setting():
    from ready.config import merge, schema
    from ready.drafter import DSparkDrafter

    target = micro_target()
    data = greedy_responses(target, micro_prompts(6, 12), 10, eos_id=None, batch_size=6, progress=False)
    cfg = merge(schema(), {"drafter": {"proposals": 4, "num_layers": 1, "head_rank": 8},
                           "reader": {"layer_space": "model", "layers": target.gdn_layer_ids[:1], "rank": 4,
                                      "mlp_hidden": 16}})
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg.drafter, cfg.reader, target).eval()
    return target, data, drafter


def test_an_untrained_reader_moves_nothing(setting):
    target, data, drafter = setting  # the reader's output projection starts at zero
    out = probe(drafter, target, data)
    assert out["dh_over_h"] == 0.0
    assert out["tau"] == out["tau_no_reader"] == out["tau_other_states"]


def test_ablations_change_the_readers_output_and_are_undone(setting):
    target, data, drafter = setting
    reader = next(iter(drafter.readers.values()))
    torch.nn.init.normal_(reader.fuse_out.weight, std=0.5)
    h = torch.randn(2, 3, target.config.hidden_size)
    c = target.config  # states [B, A, Ls, H, d_k, d_v]: 2 blocks
    states = torch.randn(2, 1, 1, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim)
    from ready.reader import StateSource

    source = StateSource.from_training(states)
    own = reader.delta(h, source)
    norms = []
    with reader_ablation(drafter, "own", norms):
        assert torch.equal(reader.delta(h, source), own) and norms and norms[0][0] > 0
    with reader_ablation(drafter, "none"):
        assert torch.equal(reader.delta(h, source), torch.zeros_like(h))
    with reader_ablation(drafter, "other"):
        other = reader.delta(h, source)
    swapped = StateSource.from_training(states.roll(1, dims=0))  # 2 blocks: rolling by one = the other's
    assert torch.allclose(other, reader.delta(h, swapped)) and not torch.allclose(other, own)
    assert torch.equal(reader.delta(h, source), own)  # undone on leaving
    with pytest.raises(ValueError, match="expected own, none or other"):
        with reader_ablation(drafter, "zero"):
            pass

