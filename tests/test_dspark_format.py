"""DSpark and DFlash checkpoints against the reference implementation (SpecForge 0.2.0's DSparkDraftModel
and DFlashDraftModel).

A random SpecForge model saved with `save_pretrained` loads here and gives the same Markov-corrected
block logits (and confidence) for the same target features; our export loads in SpecForge with no
missing or unexpected keys and the same logits, and back here bit for bit; and greedy decoding
through our engine drafts, round by round, what a reference loop that drives SpecForge's model over
a transformers-built Qwen3.5 target drafts, with the same accepted lengths.
"""

from __future__ import annotations

import json

import pytest
import torch

from ready.config import DrafterConfig, ReaderConfig
from ready.decode import Engine
from ready.drafter import DrafterError, DSparkDrafter, load_drafter, save_drafter
from ready.target import HybridConfig, HybridLM, load_target, save_target
from sweeps.commands.export import main as export_main

specforge = pytest.importorskip("specforge.modeling.draft.dspark")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

V, D, LAYERS, BLOCK = 96, 64, 4, 5  # BLOCK counts the anchor: 4 proposals
MASK = 95


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    torch.manual_seed(3)
    cfg = HybridConfig(vocab_size=V, hidden_size=D, intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=512)
    return save_target(HybridLM(cfg).eval(), tmp_path_factory.mktemp("target") / "tiny")


@pytest.fixture(scope="module")
def target(target_dir):
    return load_target(target_dir).eval()


@pytest.fixture(scope="module")
def hf(target_dir):
    """The same target as transformers' Qwen3_5ForCausalLM: the reference's features."""
    return transformers.Qwen3_5ForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


def hf_features(hf, sf, tokens: torch.Tensor) -> torch.Tensor:
    """DSpark's target_hidden: hidden_states[id + 1] of each target layer id, concatenated."""
    states = hf(tokens, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in sf.target_layer_ids], dim=-1)


def specforge_model(head: str = "vanilla", confidence: bool = True, rope_scaling=None, seed: int = 0,
                    markov_rank: int = 8):
    """A random SpecForge DSpark drafter for the tiny target (norms and heads moved off their init)."""
    cfg = transformers.Qwen3Config(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=80, vocab_size=V, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=rope_scaling,
        max_position_embeddings=4096, layer_types=["full_attention"] * 2, tie_word_embeddings=False,
        block_size=BLOCK, num_target_layers=LAYERS,
        dflash_config={"projector_type": "dspark", "mask_token_id": MASK, "target_layer_ids": [0, 2, 3],
                       "markov_head_type": head, "markov_rank": markov_rank, "enable_confidence_head": confidence,
                       "confidence_head_with_markov": confidence})
    torch.manual_seed(seed)
    model = specforge.DSparkDraftModel(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.05 * torch.randn_like(p))
            if "markov" in name or "gate_proj" in name or "joint_proj" in name:
                p.normal_(0.0, 0.3)
    return model


def specforge_block(model, hf, tokens: torch.Tensor, anchor: int):
    """SpecForge's proposal logits (Markov-corrected on the true previous tokens) and confidence, over
    features from transformers' target."""
    target = hf.model
    ctx = hf_features(hf, model, tokens)[:, :anchor]
    block = torch.tensor([[int(tokens[0, anchor])] + [MASK] * (BLOCK - 1)])
    pos = torch.arange(anchor + BLOCK)[None]
    h = model(position_ids=pos, noise_embedding=target.embed_tokens(block), target_hidden=ctx)[:, 1:]
    prev = tokens[:, anchor:anchor + BLOCK - 1]
    logits = model.apply_logits_head(hf.lm_head(h), prev_token_ids=prev, hidden_states=h)
    return logits, model.predict_confidence(h, prev_token_ids=prev), prev


def ours_block(drafter: DSparkDrafter, target, tokens: torch.Tensor, anchor: int):
    reads = dict(state_layers=drafter.state_layers, state_positions=torch.tensor([[anchor - 1]])) \
        if drafter.reader_enabled else {}
    out = target(tokens, capture_layers=drafter.capture_layers, **reads)
    logits = drafter.forward_train(tokens, out.hidden, torch.tensor([[anchor]]), out.states)[0, 0]
    return logits, out.hidden


@pytest.mark.parametrize("head,rope", [("vanilla", None), ("gated", None), ("rnn", None),
                                       ("vanilla", {"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 1024})])
def test_a_specforge_checkpoint_gives_the_reference_block_logits(target, hf, tmp_path, head, rope):
    ref = specforge_model(head, rope_scaling=rope)
    ref.save_pretrained(tmp_path / "sf")
    ours = load_drafter(tmp_path / "sf", target).eval()
    assert (ours.proposals, ours.mask_token_id, ours.capture_layers) == (BLOCK - 1, MASK, [0, 2, 3])
    tokens = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for anchor in (1, 17, 33):
            logits, hidden = ours_block(ours, target, tokens, anchor)
            want, conf, prev = specforge_block(ref, hf, tokens, anchor)
            assert torch.allclose(logits, want[0], atol=2e-5, rtol=1e-5)
            # the confidence head reads the proposals' hidden states and the Markov embedding of the previous token
            assert torch.allclose(ours.confidence(_proposal_hidden(ours, tokens, hidden, anchor), prev), conf, atol=2e-5)


def test_a_specforge_checkpoints_confidence_head_schedules_verification_as_loaded(target, hf, tmp_path):
    """The draft step's confidences are the loaded head's, sigmoid(SpecForge's predict_confidence) over the
    proposals' hidden states and the tokens drafted before them; a confidence schedule decodes with them
    losslessly."""
    from ready.decode import DraftStep, Engine
    from ready.decode.schedule import VerifySchedule

    ref = specforge_model("vanilla")
    ref.save_pretrained(tmp_path / "sf")
    ours = load_drafter(tmp_path / "sf", target).eval()
    tokens = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for anchor in (5, 30):
            feats = target(tokens[:, :anchor], capture_layers=ours.capture_layers).hidden
            step = DraftStep(tokens=tokens[:, :anchor + 1], features=feats, target=target, cache=None)
            drafts, _, conf = ours.draft_scored(step)
            ctx = hf_features(hf, ref, tokens)[:, :anchor]
            block = torch.tensor([[int(tokens[0, anchor])] + [MASK] * (BLOCK - 1)])
            h = ref(position_ids=torch.arange(anchor + BLOCK)[None], noise_embedding=hf.model.embed_tokens(block),
                    target_hidden=ctx)[:, 1:]
            prev = torch.cat([tokens[:, anchor:anchor + 1], drafts[:, :-1]], dim=1)
            assert torch.allclose(conf, torch.sigmoid(ref.predict_confidence(h, prev_token_ids=prev)), atol=2e-5)
    prompt = tokens[0, :12].tolist()
    want = Engine(target).generate(prompt, 24).tokens
    g = Engine(target, ours, verify_schedule=VerifySchedule("confidence", 0.5)).generate(prompt, 24)
    assert g.tokens == want and len(g.confidence) == len(g.verified) == len(g.accepted)


def _proposal_hidden(drafter: DSparkDrafter, tokens, hidden, anchor):
    """The normed hidden states of the proposal rows, through the drafter's own pieces."""
    ctx = drafter._context(hidden[:, :anchor])
    cos_c, sin_c = drafter._rope(torch.arange(anchor)[None])
    kv = [layer.self_attn.kv(ctx, cos_c, sin_c) for layer in drafter.layers]
    cos, sin = drafter._rope(anchor + torch.arange(drafter.proposals + 1)[None])
    return drafter._backbone(drafter._block_input(tokens[:, anchor]), cos, sin, kv, None, None)[:, 1:]


# --- DFlash: DSpark without the Markov head (drafter.head = none) ----------------------------------------

dflash_mod = pytest.importorskip("specforge.modeling.draft.dflash")


def specforge_dflash(seed: int = 0, kv_heads: int = 2):
    """A random SpecForge DFlash drafter (its generated config's dflash_config: mask token + target layers)."""
    cfg = transformers.Qwen3Config(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16,
        intermediate_size=80, vocab_size=V, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=4096,
        layer_types=["full_attention"] * 2, tie_word_embeddings=False, block_size=BLOCK, num_target_layers=LAYERS,
        dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2, 3]}, architectures=["DFlashDraftModel"])
    torch.manual_seed(seed)
    model = dflash_mod.DFlashDraftModel(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kv_heads", [2, 4])  # GQA and MHA (DFlash, unlike DSpark, needs no attention_mode)
def test_a_specforge_dflash_checkpoint_gives_the_reference_block_logits(target, hf, tmp_path, kv_heads):
    ref = specforge_dflash(kv_heads=kv_heads)
    ref.save_pretrained(tmp_path / "sf")
    ours = load_drafter(tmp_path / "sf", target).eval()
    assert ours.is_dflash and ours.drafter_cfg.head == "none" and ours.confidence_head is None
    assert (ours.proposals, ours.mask_token_id, ours.capture_layers) == (BLOCK - 1, MASK, [0, 2, 3])
    tokens = torch.randint(0, V, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for anchor in (1, 17, 33):
            logits, _ = ours_block(ours, target, tokens, anchor)
            want, conf, _ = specforge_block(ref, hf, tokens, anchor)  # DFlash: the plain LM-head logits
            assert conf is None and torch.allclose(logits, want[0], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("reader", [False, True])
def test_a_dflash_export_loads_in_specforge_and_back_here_bit_for_bit(target, hf, tmp_path, reader):
    torch.manual_seed(0)
    dcfg = DrafterConfig(proposals=BLOCK - 1, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=80, mask_token_id=MASK, context_layers=[0, 2, 3], layer_space="model",
                         head="none")
    ours = DSparkDrafter(dcfg, ReaderConfig(enabled=reader, rank=4, mlp_hidden=16, layers=[0, 2], layer_space="model"),
                         target).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "norm" in name:
                p.add_(0.05 * torch.randn_like(p))
        for r in ours.readers.values():
            r.fuse_out.weight.normal_(0, 0.3)
    assert not [k for k in ours.state_dict() if k.startswith("markov_head.")]
    save_drafter(ours, tmp_path / "ours")
    assert export_main([str(tmp_path / "ours"), str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [0, 2, 3]}
    sf, info = dflash_mod.DFlashDraftModel.from_pretrained(str(tmp_path / "out"), output_loading_info=True,
                                                           dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    back = load_drafter(tmp_path / "out", target)
    mine, theirs = ours.state_dict(), back.state_dict()
    assert back.is_dflash and mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    dflash_only = load_drafter(tmp_path / "out", target, reader_cfg=ReaderConfig(enabled=False))
    tokens = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for anchor in (3, 20):
            logits, _ = ours_block(dflash_only, target, tokens, anchor)
            want, _, _ = specforge_block(sf.eval(), hf, tokens, anchor)
            assert torch.allclose(logits, want[0], atol=2e-5, rtol=1e-5)


def test_a_dflash_drafter_with_a_confidence_head_saves_as_dspark_without_markov(target, tmp_path):
    """SpecForge's DSparkDraftModel with markov_rank 0: no Markov head, a confidence head on the hidden states."""
    dcfg = DrafterConfig(proposals=BLOCK - 1, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=80, mask_token_id=MASK, context_layers=[0, 2, 3], layer_space="model",
                         head="none", confidence_head=True, confidence_with_markov=False)
    ours = DSparkDrafter(dcfg, ReaderConfig(enabled=False), target).eval()
    save_drafter(ours, tmp_path / "ours")
    dc = json.loads((tmp_path / "ours" / "config.json").read_text())["dflash_config"]
    assert dc["projector_type"] == "dspark" and dc["markov_rank"] == 0 and not dc["confidence_head_with_markov"]
    sf, info = specforge.DSparkDraftModel.from_pretrained(str(tmp_path / "ours"), output_loading_info=True,
                                                          dtype=torch.float32)
    assert sf.markov_head is None and sf.confidence_head is not None
    assert not info["missing_keys"] and not info["unexpected_keys"]
    h = torch.randn(1, BLOCK - 1, D)
    assert torch.allclose(ours.confidence(h, torch.zeros(1, BLOCK - 1, dtype=torch.long)), sf.predict_confidence(h),
                          atol=1e-6)


def test_legacy_logit_head_names_and_shards_load(target, tmp_path):
    from safetensors.torch import load_file, save_file

    ref = specforge_model("vanilla")
    ref.save_pretrained(tmp_path / "sf")
    state = load_file(str(tmp_path / "sf" / "model.safetensors"))
    legacy = {("logit_head." + k if k.startswith(("markov_head.", "confidence_head.")) else k): v for k, v in state.items()}
    names = sorted(legacy)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: legacy[k] for k in keys}, str(tmp_path / "sf" / file), metadata={"format": "pt"})
    (tmp_path / "sf" / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "sf" / "model.safetensors.index.json").write_text(json.dumps(index))
    direct = load_drafter(tmp_path / "sf", target)
    assert torch.equal(direct.markov_head.markov_w1.weight, ref.markov_head.markov_w1.weight)
    assert torch.equal(direct.confidence_head.proj.weight, ref.confidence_head.proj.weight)


@pytest.mark.parametrize("reader", [False, True])
def test_export_loads_in_specforge_and_back_here_bit_for_bit(target, hf, tmp_path, reader, capsys):
    torch.manual_seed(0)
    dcfg = DrafterConfig(proposals=BLOCK - 1, num_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         intermediate_size=80, mask_token_id=MASK, context_layers=[0, 2, 3], layer_space="model",
                         head="gated", head_rank=8, confidence_head=True)
    ours = DSparkDrafter(dcfg, ReaderConfig(enabled=reader, rank=4, mlp_hidden=16, layers=[0, 2], layer_space="model"),
                         target).eval()
    with torch.no_grad():
        ours.markov_head.markov_w2.weight.normal_(0, 0.3)
        for r in ours.readers.values():
            r.fuse_out.weight.normal_(0, 0.3)
    save_drafter(ours, tmp_path / "ours")
    assert export_main([str(tmp_path / "ours"), str(tmp_path / "out")]) == 0
    sf, info = specforge.DSparkDraftModel.from_pretrained(str(tmp_path / "out"), output_loading_info=True,
                                                          dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    back = load_drafter(tmp_path / "out", target)
    mine, theirs = ours.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    dspark_only = load_drafter(tmp_path / "out", target, reader_cfg=ReaderConfig(enabled=False))
    tokens = torch.randint(0, V, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, hidden = ours_block(dspark_only, target, tokens, 20)
        want, _, _ = specforge_block(sf.eval(), hf, tokens, 20)
        assert torch.allclose(logits, want[0], atol=2e-5, rtol=1e-5)
        if reader:  # the reader changes the drafter's output; SpecForge (no reader) sees the DSpark part only
            assert not torch.allclose(ours_block(back, target, tokens, 20)[0], logits, atol=1e-4)


def test_generate_reads_an_export(target_dir, target, tmp_path, capsys):
    from sweeps.commands.generate import main as generate

    ref = specforge_model("rnn")
    ref.save_pretrained(tmp_path / "sf")
    assert export_main([str(tmp_path / "sf"), str(tmp_path / "out"), "--dtype", "float32"]) == 0
    capsys.readouterr()
    rc = generate(["--target", str(target_dir), "--drafter", str(tmp_path / "out"), "--method", "dspark",
                   "--prompt-ids", "1,2,3,4,5,6,7,8,9", "--max-new-tokens", "12", "--check-lossless", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["proposals"] == BLOCK - 1 and report["lossless"] == 1


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["dflash_config"].update(projector_type="eagle3"), r"projector_type is 'eagle3'; expected 'dspark' \(DSpark\) or 'dflash'"),
    (lambda c: c.update(layer_types=["full_attention", "sliding_attention"]), r"sliding-window draft layers are not supported"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[0, 9]), r"target_layer_ids = \[0, 9\]; expected ascending target layer ids in 0..3"),
    (lambda c: c.update(hidden_size=128), r"hidden_size is 128 but the target has 64"),
    (lambda c: c.update(vocab_size=1000), r"vocab_size is 1000 but the target has 96"),
    (lambda c: c["dflash_config"].update(markov_rank=0), r"confidence_head_with_markov is true with markov_rank 0"),
    (lambda c: c.update(architectures=["DFlashDraftModel"]), r"architectures DFlashDraftModel with dflash_config.markov_rank 8"),
    (lambda c: c["dflash_config"].update(mask_token_id=None), r"mask_token_id is None; expected a token id of the target"),
    (lambda c: c.pop("dflash_config"), r"no 'dflash_config' block"),
])
def test_what_the_format_says_is_honoured_or_refused_in_one_line(target, tmp_path, edit, match):
    specforge_model().save_pretrained(tmp_path / "sf")
    cfg = json.loads((tmp_path / "sf" / "config.json").read_text())
    edit(cfg)
    (tmp_path / "sf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterError, match=match):
        load_drafter(tmp_path / "sf", target)


def test_export_refuses_a_limited_context_and_a_bad_source(target, tmp_path, capsys):
    d = DSparkDrafter(DrafterConfig(proposals=BLOCK - 1, mask_token_id=MASK, context_window=8), ReaderConfig(enabled=False), target)
    save_drafter(d, tmp_path / "w")
    assert export_main([str(tmp_path / "w"), str(tmp_path / "out")]) == 2
    assert "drafter.context_window = 8" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert export_main([str(tmp_path / "nothing.txt"), str(tmp_path / "out")]) == 2
    (tmp_path / "nothing.txt").write_text("")
    assert export_main([str(tmp_path / "nothing.txt"), str(tmp_path / "out")]) == 2
    assert "neither a drafter folder nor an MLflow run id" in capsys.readouterr().err


# --- the engine against a reference loop over transformers + SpecForge --------------------------------

def reference_rounds(hf, sf, prompt: list[int], new_tokens: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Greedy speculative decoding without caches: every round runs the transformers target over the
    whole committed sequence. Returns (drafted blocks, accepted lengths, tokens after the prompt)."""
    seq = list(prompt)
    out = hf(torch.tensor([seq]), output_hidden_states=True)
    seq.append(int(out.logits[0, -1].argmax()))
    drafts, accepted = [], []
    while len(seq) - len(prompt) < new_tokens:
        ids = torch.tensor([seq])
        ctx = hf_features(hf, sf, ids[:, :-1])  # features of every token but the anchor
        a = len(seq) - 1
        block = torch.tensor([[seq[-1]] + [MASK] * (BLOCK - 1)])
        h = sf(position_ids=torch.arange(a + BLOCK)[None], noise_embedding=hf.model.embed_tokens(block),
               target_hidden=ctx)
        draft = sf._sample_draft_tokens(hf, h, block)[0].tolist()
        logits = hf(torch.tensor([seq + draft])).logits[0, a:]
        best = logits.argmax(-1).tolist()
        n = 0
        while n < len(draft) and draft[n] == best[n]:
            n += 1
        drafts.append(draft)
        accepted.append(n)
        seq += draft[:n] + [best[n]]
    return drafts, accepted, seq[len(prompt):]


@pytest.fixture(scope="module")
def bigram_target(tmp_path_factory, target_dir):
    """The tiny target with every layer's output projection zeroed: its greedy next token is a function
    of the previous token only (`table`), so a drafter can be made to know it."""
    model = load_target(target_dir)
    state = model.state_dict()
    for k in state:
        if k.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            state[k] = torch.zeros_like(state[k])
    model.load_state_dict(state)
    path = save_target(model.eval(), tmp_path_factory.mktemp("bigram") / "t")
    model = load_target(path).eval()
    with torch.no_grad():
        table = model(torch.arange(V)[None]).logits[0].argmax(-1)
    return model, transformers.Qwen3_5ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval(), table


@pytest.mark.parametrize("drafter_kind", ["random", "knows_two_thirds_of_the_bigrams", "dflash"])
def test_engine_rounds_equal_a_reference_loop_over_transformers_and_specforge(target, hf, bigram_target, tmp_path,
                                                                             drafter_kind):
    """Round by round: the same drafted block and the same accepted length as the reference loop. The
    random drafter is (almost) always rejected; the bigram one is accepted for runs of every length."""
    if drafter_kind == "random":
        sf = specforge_model("vanilla", confidence=False, seed=5)
    elif drafter_kind == "dflash":  # SpecForge's DFlash model: its block is the argmax of the LM-head logits
        sf = specforge_dflash(seed=5)
    else:
        target, hf, table = bigram_target
        sf = specforge_model("vanilla", confidence=False, seed=5, markov_rank=V)
        wrong = torch.arange(V) % 3 == 0  # a third of the bigrams point elsewhere: rejections mid-block
        nxt = torch.where(wrong, (table + 1) % V, table)
        with torch.no_grad():
            sf.markov_head.markov_w1.weight.copy_(torch.eye(V))
            sf.markov_head.markov_w2.weight.zero_()
            sf.markov_head.markov_w2.weight[nxt, torch.arange(V)] = 50.0
    sf.save_pretrained(tmp_path / "sf")
    drafter = load_drafter(tmp_path / "sf", target).eval()
    seen: list[list[int]] = []
    propose = drafter.propose

    def spy(step):
        out = propose(step)
        seen.append(out[0].tolist())
        return out

    drafter.propose = spy
    engine = Engine(target, drafter)
    g = torch.Generator().manual_seed(11)
    accepted = []
    for length in (3, 14):
        prompt = torch.randint(0, V, (length,), generator=g).tolist()
        seen.clear()
        with torch.no_grad():
            want_drafts, want_accepted, want_tokens = reference_rounds(hf, sf, prompt, 24)
        gen = engine.generate(prompt, 24)
        rounds = len(gen.accepted)
        assert seen[:rounds] == want_drafts[:rounds]
        # the engine caps a round's accepted length at its horizon (the budget's end)
        assert gen.accepted == [min(a, h) for a, h in zip(want_accepted, gen.horizons)]
        assert gen.tokens == want_tokens[:len(gen.tokens)]
        accepted += gen.accepted
    if drafter_kind == "knows_two_thirds_of_the_bigrams":  # rejections at every position, and whole blocks accepted
        assert 0 in accepted and BLOCK - 1 in accepted and len(set(accepted)) >= 3
