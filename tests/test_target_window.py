"""A target pretrained with sliding-window attention (`target.attention_window`, the positive
control's target): its attention layers forget what lies beyond the window on every path (the
uncached forward of training, prefill + steps, verify, the static cache of the graphs, exact mode,
the ragged batch), and the knob at 0 changes no hash and no number of a target built before it."""

from __future__ import annotations

import json
import random

import pytest
import torch

from ready.config import ConfigError, merge, schema, validate
from ready.target import HybridConfig, HybridLM, TargetError, load_target, save_target

torch.set_num_threads(1)
VOCAB = 96
W = 5


def config(**kw) -> HybridConfig:
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
                linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256)
    return HybridConfig(**{**base, **kw})


def model(seed: int = 3, **kw) -> HybridLM:
    torch.manual_seed(seed)
    return HybridLM(config(**kw)).eval()


@pytest.fixture(scope="module")
def windowed() -> HybridLM:
    return model(sliding_window=W)


def test_attention_only_target_forgets_everything_beyond_its_window():
    """With attention layers only (no GDN states to carry older text), each layer looks W - 1 tokens
    further back, so the logits at t are a function of tokens t - 4 (W - 1) .. t alone (RoPE is
    relative: those tokens on their own give the same logits)."""
    m = model(layer_types=["full_attention"] * 4, sliding_window=W)
    reach = 4 * (W - 1)
    ids = torch.randint(0, VOCAB, (1, 30))
    with torch.no_grad():
        full = m(ids).logits[0]
        for t in (reach, 22, 29):
            alone = m(ids[:, t - reach: t + 1]).logits[0, -1]
            assert torch.allclose(full[t], alone, atol=1e-4), f"position {t}"
        changed = ids.clone()
        changed[0, :29 - reach] = (changed[0, :29 - reach] + 1) % VOCAB  # all that position 29 cannot reach
        out = m(changed).logits[0]
        assert torch.allclose(out[29], full[29], atol=1e-4)
        assert not torch.allclose(out[24], full[24], atol=1e-4)  # position 24 reaches some of it


def test_the_window_changes_a_hybrid_target_only_beyond_the_window():
    whole, cut = model(), model(sliding_window=W)  # the same weights
    ids = torch.randint(0, VOCAB, (1, 24))
    with torch.no_grad():
        a, b = whole(ids).logits[0], cut(ids).logits[0]
    assert torch.allclose(a[:W], b[:W], atol=1e-5)  # every earlier key fits in the window
    assert not torch.allclose(a[W + 2:], b[W + 2:], atol=1e-3)


@pytest.mark.parametrize("static", [False, True])
def test_cached_decoding_equals_the_uncached_forward(windowed, static):
    """Prefill, steps, verify + partial commit, on the dynamic cache and on the graphs' static layout."""
    ids = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        full = windowed(ids).logits[0]
        cache = windowed.new_cache(1, 64, 8)
        assert torch.allclose(windowed.prefill(ids[:, :17], cache).logits[0], full[:17], atol=1e-5)
        cache.static = static
        for t in range(17, 24):
            assert torch.allclose(windowed.step(ids[:, t:t + 1], cache).logits[0, 0], full[t], atol=1e-5)
        ver = windowed.verify(ids[:, 24:30], cache).logits[0]
        assert torch.allclose(ver, full[24:30], atol=1e-5)
        windowed.commit(cache, 3)
        assert torch.allclose(windowed.verify(ids[:, 27:35], cache).logits[0], full[27:35], atol=1e-5)


def test_exact_mode_steps_equal_verify_bit_for_bit(windowed):
    """Exact mode's fixed-order attention honours the window: verify(T) and T steps give equal bits."""
    m = model(sliding_window=W).to(torch.bfloat16)
    m.exact = True
    prompt, block = torch.randint(0, VOCAB, (1, 13)), torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        c1, c2 = m.new_cache(1, 64, 8), m.new_cache(1, 64, 8)
        m.prefill(prompt, c1)
        m.prefill(prompt, c2)
        ver = m.verify(block, c1).logits[0]
        steps = torch.cat([m.step(block[:, i:i + 1], c2).logits[0] for i in range(6)])
        fast = model(sliding_window=W).to(torch.bfloat16)
        want = fast(torch.cat([prompt, block], 1)).logits[0, 13:].float()
    assert torch.equal(ver, steps)
    assert (ver.float() - want).abs().max() < 0.1  # and is the windowed model (bf16 rounding apart)


def test_ragged_batch_decodes_each_row_as_alone(windowed):
    from ready.decode import Engine, NgramDrafter
    
    rng = random.Random(0)
    ps = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 19, 11)]
    drafter = NgramDrafter(VOCAB, 3)
    want = [Engine(windowed, drafter).generate(p, 14).tokens for p in ps]
    got = Engine(windowed, drafter, batch_size=3, slots="ragged").decode(ps, [14] * 3).generations
    assert [g.tokens for g in got] == want


def test_config_round_trip_and_the_default_leaves_config_json_as_before(tmp_path):
    assert "sliding_window" not in config().to_hf_dict()  # every earlier target's spec hash holds
    d = config(sliding_window=W).to_hf_dict()
    assert d["sliding_window"] == W and d["use_sliding_window"] is True
    save_target(model(sliding_window=W), tmp_path / "m")
    assert load_target(tmp_path / "m").config.sliding_window == W
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    raw["use_sliding_window"] = False  # a Qwen2-style config carries a window it does not use
    assert HybridConfig.from_hf_dict(raw).sliding_window is None
    with pytest.raises(TargetError, match="sliding_window is 0"):
        config(sliding_window=0)


def test_the_knob_is_validated(tmp_path):  # left out of row hashes at 0: tests/test_sweeps_spec.py
    from ready.loading import PipelineConfigError, target_dir

    cfg = merge(schema(), {})
    assert cfg.target.attention_window == 0
    windowed = merge(cfg, {"target": {"attention_window": 16}})
    with pytest.raises(ConfigError, match="target.attention_window"):
        validate(merge(cfg, {"target": {"attention_window": -1}}))
    ckpt = merge(windowed, {"target": {"source": str(tmp_path)}})
    with pytest.raises(PipelineConfigError, match="attention_window.*checkpoint"):
        target_dir(ckpt, progress=False)
