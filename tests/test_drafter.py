"""DSpark drafter: training and drafting agree, a fresh reader changes nothing, checkpoints know their target."""

import dataclasses

import pytest
import torch

from ready.config import DrafterConfig, ReaderConfig
from ready.decode.protocol import DraftStep, Drafter
from ready.drafter import DrafterError, DSparkDrafter, load_drafter, save_drafter
from ready.target import HybridConfig, HybridLM

V = 64


def tiny_target(seed: int = 0, layers: int = 8, **kw) -> HybridLM:
    torch.manual_seed(seed)
    cfg = HybridConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, **kw)
    return HybridLM(cfg).eval().requires_grad_(False)


def drafter_for(target, seed=0, reader=True, trained_reader=True, **kw) -> DSparkDrafter:
    dk = dict(proposals=4, num_layers=2, head_rank=8)  # K = 4 proposals
    rk = dict(enabled=reader, rank=4, mlp_hidden=16)
    for k, v in kw.items():
        (rk if k in ReaderConfig.__dataclass_fields__ else dk)[k] = v
    torch.manual_seed(seed)
    d = DSparkDrafter(DrafterConfig(**dk), ReaderConfig(**rk), target)
    if trained_reader:  # readers that have learned something, so their reads matter
        for r in d.readers.values():
            torch.nn.init.normal_(r.fuse_out.weight, std=0.3)
    if d.markov_head.rank:  # likewise for the sequence head (none: DFlash, no head)
        torch.nn.init.normal_(d.markov_head.markov_w2.weight, std=0.3)
    return d


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def teacher(target, drafter, ids, anchors):
    with torch.no_grad():
        out = target(ids, capture_layers=drafter.capture_layers, state_layers=drafter.state_layers,
                     state_positions=(anchors - 1) if drafter.state_layers else None)
    return out.hidden, out.states


def draft_step(target, drafter, ids) -> DraftStep:
    """What the engine hands the drafter after committing `ids`: features and states of ids[:, :-1]."""
    cache = target.new_cache(ids.shape[0], max_len=64)
    out = target.prefill(ids[:, :-1], cache, capture_layers=drafter.capture_layers)
    return DraftStep(tokens=ids, features=out.hidden, target=target, cache=cache)


def test_resolved_layers_follow_relative_depth(target):
    d = drafter_for(target)
    # paper ids (64 layers) -> this 8-layer target: context [1,17,33,49,62], states (30, 62)
    assert d.resolved() == {"context_layers": [0, 2, 4, 5, 7], "state_layers": [4, 6], "inject_layers": [1]}
    assert d.capture_layers == [0, 2, 4, 5, 7] and d.state_layers == [4, 6]
    off = drafter_for(target, reader=False)
    assert off.resolved()["state_layers"] == [] and off.reader_parameters() == []


def test_parameter_groups_are_disjoint_and_exclude_the_shared_embeddings(target):
    d = drafter_for(target)
    rd, bb = {id(p) for p in d.reader_parameters()}, {id(p) for p in d.backbone_parameters()}
    assert rd and bb and not rd & bb and rd | bb == {id(p) for p in d.parameters()}
    shared = {id(target.embed_tokens.weight), id(target.lm_head.weight)}
    assert not shared & (rd | bb)
    assert not any(k.startswith(("embed", "lm_head")) for k in d.state_dict())


@pytest.mark.parametrize("head,position,window,context", [("vanilla", "post", 0, None), ("gated", "pre", 0, None),
                                                          ("rnn", "post", 0, None), ("vanilla", "post", 3, None),
                                                          ("vanilla", "post", 3, [-1]), ("gated", "post", 0, [-1, 33]),
                                                          ("none", "post", 0, None)])
def test_drafting_equals_teacher_forced_training_on_its_own_drafts(target, head, position, window, context):
    """propose() (cache, incremental context) and forward_train() (full sequence, sampled anchors) agree,
    also when the context is cut to the last `window` tokens or made of the token embeddings (-1; the
    positive control)."""
    kw = {} if context is None else {"context_layers": context}
    d = drafter_for(target, head=head, position=position, inject_layers=[0, -1], context_window=window, **kw)
    torch.manual_seed(1)
    prompt = torch.randint(0, V, (2, 9))
    toks, logits = d.draft(draft_step(target, d, prompt))
    assert toks.shape == (2, 4) and toks.dtype == torch.long
    ids = torch.cat([prompt, toks, torch.randint(0, V, (2, 3))], dim=1)  # drafts then unrelated tokens
    a = prompt.shape[1] - 1
    anchors = torch.tensor([[2, a], [a, 5]])
    hidden, states = teacher(target, d, ids, anchors)
    train = d.forward_train(ids, hidden, anchors, states)
    assert train.shape == (2, 2, 4, V)
    torch.testing.assert_close(train[0, 1], logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(train[1, 0], logits[1], rtol=1e-4, atol=1e-4)


def test_a_context_window_hides_older_tokens_from_the_drafter(target):
    """With context_window=W, tokens further back than W change nothing the drafter sees (reader off)."""
    d = drafter_for(target, reader=False, context_window=3)
    torch.manual_seed(2)
    prompt = torch.randint(0, V, (1, 12))
    other = prompt.clone()
    other[0, :4] = (other[0, :4] + 1) % V  # older than the last 3 context positions (8..10)
    _, a = d.draft(draft_step(target, d, prompt))
    _, b = d.draft(draft_step(target, d, other))
    # the target features of the window do depend on the older tokens (the target sees them), so
    # compare against the same features with the old part zeroed instead: the drafter ignores it
    step = draft_step(target, d, prompt)
    step.features[:, :8] = 0
    d.begin(prompt)
    _, c = d.draft(step)
    torch.testing.assert_close(a, c)
    assert not torch.allclose(a, b)  # ... while the target itself carried the older tokens forward


def test_an_embeddings_context_over_a_window_sees_nothing_older(target):
    """context_layers=[-1]: the features are the target's token embeddings, which carry nothing of other
    tokens; with context_window=W, tokens older than W change nothing the drafter computes (reader off),
    unlike target-layer features, which carry older tokens forward."""
    d = drafter_for(target, reader=False, context_layers=[-1], context_window=3)
    assert d.capture_layers == [-1]
    torch.manual_seed(2)
    prompt = torch.randint(0, V, (1, 12))
    other = prompt.clone()
    other[0, :4] = (other[0, :4] + 1) % V  # older than the last 3 context positions (8..10)
    step = draft_step(target, d, prompt)
    torch.testing.assert_close(step.features[:, :, 0], target.embed_tokens(prompt[:, :-1]))
    _, a = d.draft(step)
    _, b = d.draft(draft_step(target, d, other))
    torch.testing.assert_close(a, b)


def test_a_fresh_reader_leaves_the_drafters_logits_unchanged(target):
    base = drafter_for(target, reader=False)
    ready = drafter_for(target, trained_reader=False)
    ready.load_state_dict({**ready.state_dict(), **base.state_dict()})
    torch.manual_seed(2)
    ids = torch.randint(0, V, (2, 16))
    anchors = torch.tensor([[3, 9], [1, 12]])
    hidden, states = teacher(target, ready, ids, anchors)
    assert torch.equal(base.forward_train(ids, hidden, anchors), ready.forward_train(ids, hidden, anchors, states))
    step = draft_step(target, ready, ids[:, :10])
    assert torch.equal(base.draft(step)[1], ready.draft(step)[1])


def test_the_reader_reads_the_committed_states(target):
    d = drafter_for(target)
    ids = torch.randint(0, V, (1, 10))
    step = draft_step(target, d, ids)
    before = d.draft(step)[1]
    step.cache.ssm[target.gdn_index(d.state_layers[0])] *= 3.0
    d.begin(ids)
    assert not torch.allclose(before, d.draft(step)[1])
    with pytest.raises(DrafterError, match="needs committed states of shape"):
        d.forward_train(ids, teacher(target, d, ids, torch.tensor([[4]]))[0], torch.tensor([[4]]), None)


def test_propose_is_deterministic_and_follows_the_protocol(target):
    d = drafter_for(target)
    assert isinstance(d, Drafter) and d.proposals == 4 and d.vocab_size == V
    ids = torch.randint(0, V, (2, 12))
    d.begin(ids[:, :6])
    d.propose(draft_step(target, d, ids[:, :7]))  # an earlier round: context K/V cached for 6 tokens
    step = draft_step(target, d, ids)
    first = d.propose(step)
    assert first.shape == (2, 4) and first.dtype == torch.long and int(first.max()) < V
    assert torch.equal(first, d.propose(step))
    fresh = drafter_for(target)  # same weights, no cached context
    assert torch.equal(d.draft(step)[1], fresh.draft(step)[1])


def test_prompt_of_one_token_drafts_without_context(target):
    d = drafter_for(target)
    ids = torch.randint(0, V, (1, 1))
    cache = target.new_cache(1, max_len=16)
    step = DraftStep(tokens=ids, features=torch.zeros(1, 0, 5, 32), target=target, cache=cache)
    assert d.propose(step).shape == (1, 4)


def test_save_and_load_round_trip(target, tmp_path):
    d = drafter_for(target, head="rnn")
    save_drafter(d, tmp_path / "drafter")
    back = load_drafter(tmp_path / "drafter", target)
    assert back.resolved() == d.resolved()
    step = draft_step(target, d, torch.randint(0, V, (1, 8)))
    assert torch.equal(d.draft(step)[1], back.draft(step)[1])
    # a base checkpoint under a new reader config: backbone kept, fresh (identity) reader
    base = drafter_for(target, reader=False)
    save_drafter(base, tmp_path / "base")
    staged = load_drafter(tmp_path / "base", target, reader_cfg=ReaderConfig(rank=2, mlp_hidden=8))
    assert staged.state_layers == [4, 6] and staged.readers["1"].rank == 2
    assert torch.equal(base.draft(step)[1], staged.draft(step)[1])


def test_a_checkpoint_counts_the_anchor_in_block_size_and_one_saved_before_the_rename_loads(target, tmp_path):
    """`drafter.proposals` = K; DSpark's config.json `block_size` counts the anchor (K + 1), the one place it is
    written. A folder saved before the rename (its `ready_drafter` block says block_size) and a DSpark folder
    without that block both load as K = block_size - 1; a block that names both is one DrafterError."""
    import json

    d = drafter_for(target, reader=False)  # K = 4
    save_drafter(d, tmp_path / "d")
    file = tmp_path / "d" / "config.json"
    raw = json.loads(file.read_text())
    own = raw["ready_drafter"]["drafter"]
    assert raw["block_size"] == 5 and own["proposals"] == 4 and "block_size" not in own
    step = draft_step(target, d, torch.randint(0, V, (1, 8)))
    own["block_size"] = own.pop("proposals") + 1  # as written before the rename
    file.write_text(json.dumps(raw))
    back = load_drafter(tmp_path / "d", target)
    assert back.proposals == 4 and torch.equal(d.draft(step)[1], back.draft(step)[1])
    own["proposals"] = 4
    file.write_text(json.dumps(raw))
    with pytest.raises(DrafterError, match=r"config.json: ready_drafter: bad value at key 'drafter.block_size': 5; "
                                           r"this key was renamed drafter.proposals"):
        load_drafter(tmp_path / "d", target)
    del raw["ready_drafter"]  # a DSpark folder from elsewhere: its block_size alone
    file.write_text(json.dumps(raw))
    assert load_drafter(tmp_path / "d", target).proposals == 4


def test_checkpoint_for_another_target_is_one_clear_error(target, tmp_path):
    save_drafter(drafter_for(target), tmp_path / "d")
    with pytest.raises(DrafterError, match="built for another target: same architecture but different embed"):
        load_drafter(tmp_path / "d", tiny_target(seed=1))
    with pytest.raises(DrafterError, match=r"d/config.json: num_target_layers is 8 but the target has 12 layers; expected a drafter built for this target"):
        load_drafter(tmp_path / "d", tiny_target(layers=12))
    with pytest.raises(DrafterError, match="no drafter checkpoint here"):
        load_drafter(tmp_path / "missing", target)


def test_save_refuses_to_replace_a_folder_with_other_files(target, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("keep me")
    with pytest.raises(DrafterError, match=r"not a drafter folder \(holds \['notes.txt'\]\)"):
        save_drafter(drafter_for(target), tmp_path / "run")
    assert (tmp_path / "run" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("kw,match", [
    (dict(inject_layers=[2]), r"reader.inject_layers: draft layer 2 is beyond the drafter's depth \(drafter.num_layers = 2\)"),
    (dict(rank=9), r"reader.rank = 9 .* d_k = 8"),
    (dict(layers=[31]), r"reader.layers: paper layer 31 is a full-attention layer"),
    (dict(layers=[64]), r"reader.layers: layer id 64 is outside the paper's 64-layer target"),
    (dict(layers=[3], layer_space="model"), r"reader.layers: model layer 3 is a full-attention layer .* \[0, 1, 2, 4, 5, 6\]"),
    (dict(head="lstm"), r"drafter.head: 'lstm' is unknown"),
    (dict(context_layers=[70]), r"drafter.context_layers: layer id 70 is outside"),
    (dict(context_layers=[8], layer_space="model"), r"drafter.context_layers: model layer id 8 is out of range"),
])
def test_bad_settings_are_one_clear_error(target, kw, match):
    part = "drafter" if "context_layers" in kw or "head" in kw else "reader"
    dk, rk = dict(proposals=4, num_layers=2), dict(rank=4, mlp_hidden=16)
    (dk if part == "drafter" else rk).update(kw)
    with pytest.raises(ValueError, match=match):
        DSparkDrafter(DrafterConfig(**dk), ReaderConfig(**rk), target)


def test_a_dflash_drafter_drafts_the_plain_lm_head_logits(target):
    """drafter.head = none: no Markov parameters, and the block logits are the LM head over the draft
    layers' output, whatever the previous tokens are."""
    d = drafter_for(target, reader=False, head="none").eval()
    assert d.is_dflash and not drafter_for(target, reader=False).is_dflash
    assert not [k for k in d.state_dict() if k.startswith("markov_head.")]
    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(4))
    anchors = torch.tensor([[9, 15], [12, 18]])
    hidden, _ = teacher(target, d, ids, anchors)
    with torch.no_grad():
        logits = d.forward_train(ids, hidden, anchors)
        other = ids.clone()
        other[:, 10:] = (other[:, 10:] + 1) % V  # other labels (the previous tokens a Markov head would read)
        changed = d.forward_train(other, hidden, anchors)
    # block (0, 0): its anchor token and context are the same, its labels (a Markov head's previous tokens) not
    torch.testing.assert_close(logits[0, 0], changed[0, 0])
    step = draft_step(target, d, ids[:, :12])
    toks, draft_logits = d.draft(step)
    assert torch.equal(draft_logits.argmax(-1), toks)


def test_target_without_gdn_layers_has_no_state_to_read():
    t = tiny_target(layers=2, layer_types=["full_attention", "full_attention"])
    with pytest.raises(ValueError, match="the target has no Gated DeltaNet layers"):
        drafter_for(t)
    assert drafter_for(t, reader=False).capture_layers == [0, 1]


def test_lora_adapters_must_be_merged_before_saving(target, tmp_path):
    from peft import LoraConfig, get_peft_model

    d = drafter_for(target)
    wrapped = get_peft_model(d, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    assert not any("lora" in n for n, _ in d.readers.named_parameters())  # readers and heads stay plain
    with pytest.raises(DrafterError, match="still carries LoRA adapters; merge them first"):
        save_drafter(d, tmp_path / "d")
    merged = wrapped.merge_and_unload()
    save_drafter(merged, tmp_path / "d")
    step = draft_step(target, merged, torch.randint(0, V, (1, 8)))
    assert torch.equal(merged.draft(step)[1], load_drafter(tmp_path / "d", target).draft(step)[1])


def test_the_lm_head_runs_as_one_2d_product_over_strided_rows(target, monkeypatch):
    """The draft step's h[:, 1:] of B > 1 rows (and training's [B, A, K, D] view) is strided; handed to the
    linear as it is, matmul takes its batched path and streams the whole head once per row (28 ms of a
    33 ms draft step at B = 32 on an H100). `_logits` flattens it: one 2-D product, the same logits."""
    import ready.drafter.model as drafter_model

    drafter = drafter_for(target)
    h = torch.randn(3, 8, drafter.hidden_size)[:, 1:]
    assert not h.is_contiguous()
    shapes = []
    real = drafter_model.linear
    monkeypatch.setattr(drafter_model, "linear", lambda x, w: shapes.append(tuple(x.shape)) or real(x, w))
    logits = drafter._logits(h)
    assert shapes == [(3 * 7, drafter.hidden_size)]
    want = torch.nn.functional.linear(h.contiguous(), target.lm_head.weight).float()
    assert logits.shape == (3, 7, target.config.vocab_size) and torch.allclose(logits, want, atol=1e-5)


def test_a_drafter_built_from_empty_sections_has_the_dataclasses_defaults(target):
    """Each default is written once, in DrafterConfig / ReaderConfig: the drafter gets its sections as those
    dataclasses, whatever form they came in, and reads their attributes."""
    d = DSparkDrafter({}, {}, target)
    assert d.drafter_cfg == DrafterConfig() and d.reader_cfg == ReaderConfig()
    assert d.proposals == DrafterConfig().proposals and d.readers["1"].rank == ReaderConfig().rank
    assert d.context_window == DrafterConfig().context_window and d.position == ReaderConfig().position


@pytest.mark.parametrize("block, edit, shown", [
    ("ready_drafter", lambda c: c["ready_drafter"]["drafter"].update(haed=c["ready_drafter"]["drafter"].pop("head")),
     "unknown key 'ready_drafter.drafter.haed' (did you mean 'ready_drafter.drafter.head'?); expected one of "
     "DrafterConfig's keys: proposals, num_layers, "),
    ("ready_reader", lambda c: c["ready_reader"]["config"].update(rnak=2),
     "unknown key 'ready_reader.config.rnak' (did you mean 'ready_reader.config.rank'?); expected one of "
     "ReaderConfig's keys: enabled, rank, "),
])
def test_a_misspelled_key_in_a_checkpoints_config_is_one_line_naming_it(target, tmp_path, block, edit, shown):
    """A typo in the drafter or reader block of a saved config.json is refused, never read as the default."""
    import json

    from ready.drafter.checkpoint import has_markov_head

    save_drafter(drafter_for(target, head="gated"), tmp_path / "d")
    file = tmp_path / "d" / "config.json"
    raw = json.loads(file.read_text())
    edit(raw)
    file.write_text(json.dumps(raw))
    with pytest.raises(DrafterError) as e:
        load_drafter(tmp_path / "d", target)
    assert str(e.value).startswith(f"{file}: {shown}") and "\n" not in str(e.value)
    if block == "ready_drafter":  # what a sweep asks of a drafter.checkpoint before loading it
        with pytest.raises(DrafterError, match=r"unknown key 'ready_drafter.drafter.haed'"):
            has_markov_head(tmp_path / "d")


def test_a_checkpoint_saved_before_later_keys_loads_them_at_the_dataclasses_defaults(target, tmp_path):
    """The config.json blocks of an earlier version (keys added since absent, DSpark's block_size in place of
    proposals) load with today's defaults for what they lack, and the drafter drafts as it did."""
    import json

    d = drafter_for(target)
    save_drafter(d, tmp_path / "d")
    file = tmp_path / "d" / "config.json"
    raw = json.loads(file.read_text())
    own, reader = raw["ready_drafter"]["drafter"], raw["ready_reader"]["config"]
    # the blocks are the typed sections as saved (keys in the dataclass's order), as before they were typed
    assert list(own) == list(DrafterConfig.__dataclass_fields__) and own == dataclasses.asdict(d.drafter_cfg)
    assert list(reader) == list(ReaderConfig.__dataclass_fields__) and reader == dataclasses.asdict(d.reader_cfg)
    for key in ("context_window", "layer_space", "confidence_head", "confidence_with_markov", "checkpoint"):
        del own[key]
    own["block_size"] = own.pop("proposals") + 1
    for key in ("layer_space", "states"):
        del reader[key]
    file.write_text(json.dumps(raw))
    back = load_drafter(tmp_path / "d", target)
    assert back.drafter_cfg == d.drafter_cfg and back.reader_cfg == d.reader_cfg
    step = draft_step(target, d, torch.randint(0, V, (1, 8)))
    assert torch.equal(d.draft(step)[1], back.draft(step)[1])
