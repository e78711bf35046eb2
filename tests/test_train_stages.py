"""Training stages on a micro random target: what each stage may change, resume, loss goes down."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from ready.drafter import DSparkDrafter
from ready.train import greedy_responses, train_stage
from ready.train.lora import LoraSetupError, base_name, merge_lora_
from ready.train.stages import TrainStageError, evaluate_loss
from test_train_helpers import micro_cfg, micro_prompts, micro_target




@pytest.fixture(scope="module")
def target():
    return micro_target()


@pytest.fixture(scope="module")
def data(target):
    return greedy_responses(target, micro_prompts(16, 12), 12, eos_id=None, batch_size=8, progress=False)


def _drafter(cfg, target, reader: bool, seed: int = 0) -> DSparkDrafter:
    torch.manual_seed(seed)
    rcfg = OmegaConf.merge(cfg.reader, {"enabled": reader})
    return DSparkDrafter(cfg.drafter, rcfg, target)


def _snapshot(module) -> dict[str, torch.Tensor]:
    return {base_name(n): p.detach().clone() for n, p in module.named_parameters()}


def _changed(before: dict, module) -> set[str]:
    after = {base_name(n): p.detach() for n, p in module.named_parameters()}
    changed = {n for n, p in after.items() if n in before and not torch.equal(before[n], p)}
    new = {n for n in after if n not in before}
    return changed | {n for n in new if not _is_lora_init_unchanged(n, after[n])}


def _is_lora_init_unchanged(name, p) -> bool:  # lora_B starts at zero: still zero = untouched
    return ".lora_B." in name and bool((p == 0).all())


def _target_unchanged(target, before) -> bool:
    return all(torch.equal(p, before[n]) for n, p in target.state_dict().items())


def test_stage1_updates_only_reader_parameters(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    d = _drafter(cfg, target, reader=True)
    tgt_before = copy.deepcopy(target.state_dict())
    before = _snapshot(d)
    res = train_stage("stage1", d, target, data, cfg, tmp_path / "s1", progress=False)
    changed = _changed(before, d)
    reader = {n for n, _ in d.named_parameters() if n.startswith("readers.")}
    assert changed and changed <= reader
    assert changed == reader  # every reader tensor moved (the output projection starts at zero)
    assert set(res.trainable) == reader
    assert _target_unchanged(target, tgt_before)


def test_stage2_updates_only_reader_and_lora(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    d = _drafter(cfg, target, reader=True)
    before = _snapshot(d)
    train_stage("stage2", d, target, data, cfg, tmp_path / "s2", progress=False)
    changed = _changed(before, d)
    lora = {n for n, _ in d.named_parameters() if ".lora_" in n}
    reader = {n for n, _ in d.named_parameters() if n.startswith("readers.")}
    assert lora and changed <= lora | reader
    assert any(n in changed for n in lora) and any(n in changed for n in reader)
    for n, p in d.named_parameters():  # backbone base weights stay put
        if ".lora_" not in n and not n.startswith("readers."):
            assert torch.equal(p, before[base_name(n)]), n
    n_lora = len(lora)
    train_stage("stage2", d, target, data, cfg, tmp_path / "again", progress=False)  # keeps the same adapters
    assert len([n for n, _ in d.named_parameters() if ".lora_" in n]) == n_lora


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_no_state_control_updates_only_lora(tmp_path, target, data, stage):
    cfg = micro_cfg(tmp_path)
    d = _drafter(cfg, target, reader=False)
    assert d.reader_parameters() == []
    before = _snapshot(d)
    res = train_stage(stage, d, target, data, cfg, tmp_path / stage, progress=False)
    changed = _changed(before, d)
    lora = {n for n, _ in d.named_parameters() if ".lora_" in n}
    assert changed and changed <= lora
    assert res.steps == 6  # the same budget as ReaDy's stage (24 samples / batch 4)


def test_merged_lora_drafter_equals_the_adapted_one(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    d = _drafter(cfg, target, reader=True)
    train_stage("stage2", d, target, data, cfg, tmp_path / "s2", progress=False)
    tokens = data.tokens[:2]
    feats = target(tokens, capture_layers=d.capture_layers, state_layers=d.state_layers,
                   state_positions=torch.tensor([[12, 15], [13, 18]]) - 1)
    anchors = torch.tensor([[12, 15], [13, 18]])
    with torch.no_grad():
        adapted = d.forward_train(tokens, feats.hidden, anchors, feats.states)
        merge_lora_(d)
        merged = d.forward_train(tokens, feats.hidden, anchors, feats.states)
    assert not any(".lora_" in n for n, _ in d.named_parameters())
    assert set(d.state_dict()) == set(_drafter(cfg, target, reader=True).state_dict())
    assert torch.allclose(adapted, merged, atol=1e-5)


class _Interrupt(Exception):
    pass


def test_interrupted_stage_resumes_to_the_same_weights(tmp_path, target, data):
    cfg = micro_cfg(tmp_path, checkpoint_every=2)  # 6 steps, checkpoints after steps 2, 4, 6
    start = _drafter(cfg, target, reader=True, seed=5).state_dict()

    def fresh():
        d = _drafter(cfg, target, reader=True, seed=99)  # different init: the checkpoint must restore it all
        d.load_state_dict(start)
        return d

    whole = fresh()
    ref = train_stage("stage2", whole, target, data, cfg, tmp_path / "whole", progress=False)

    def boom(name, value, step):
        if step == 5:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train_stage("stage2", fresh(), target, data, cfg, tmp_path / "cut", callback=boom, progress=False)
    seen = []
    resumed_model = fresh()
    res = train_stage("stage2", resumed_model, target, data, cfg, tmp_path / "cut",
                      callback=lambda n, v, s: seen.append(s), progress=False)
    assert res.resumed_from == 4
    assert min(seen) == 5 and max(seen) == 6
    a, b = dict(whole.named_parameters()), dict(resumed_model.named_parameters())
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n
    assert res.losses == ref.losses


def test_base_training_lowers_the_loss(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    cfg.train.base.update(samples=160, lr=1e-2, anchors_per_sample=6)
    d = _drafter(cfg, target, reader=False)
    before = evaluate_loss(d, target, data, cfg)
    curve = []
    res = train_stage("base", d, target, data, cfg, tmp_path / "base", progress=False,
                      callback=lambda n, v, s: curve.append(v) if n == "train/base/loss" else None)
    after = evaluate_loss(d, target, data, cfg)
    assert res.steps == 40 and curve == res.losses
    assert after < before - 0.2  # ln(128) = 4.85 at the start
    assert res.last_loss < res.first_loss
    assert set(res.trainable) == {n for n, _ in d.named_parameters()}  # everything but the shared embeddings/head


def _with_head(cfg):
    return OmegaConf.merge(cfg, {"drafter": {"confidence_head": True}})


def test_base_training_trains_dsparks_confidence_head_with_its_loss(tmp_path, target, data):
    """The base drafter's training (as DeepSpec's trainer): the head's BCE against the acceptance rate
    goes down and its predictions move toward the rates; the head's weights move."""
    cfg = _with_head(micro_cfg(tmp_path))
    cfg.train.base.update(samples=160, lr=1e-2, anchors_per_sample=6)
    d = _drafter(cfg, target, reader=False)
    before = _snapshot(d)
    curve: dict[str, list] = {}
    train_stage("base", d, target, data, cfg, tmp_path / "base", progress=False,
                callback=lambda n, v, s: curve.setdefault(n, []).append(v))
    conf = curve["train/base/confidence"]
    assert len(conf) == 40 and sum(conf[-5:]) / 5 < sum(conf[:5]) / 5
    assert sum(curve["train/base/confidence_error"][-5:]) < sum(curve["train/base/confidence_error"][:5])
    assert {"confidence_head.proj.weight", "confidence_head.proj.bias"} <= _changed(before, d)
    # without the loss (weight 0) the head receives no gradient at all: it stays where it started
    cfg0 = _with_head(micro_cfg(tmp_path))
    cfg0.train.loss.confidence_weight = 0.0
    d0 = _drafter(cfg0, target, reader=False)
    before0 = _snapshot(d0)
    names = []
    train_stage("base", d0, target, data, cfg0, tmp_path / "base0", progress=False,
                callback=lambda n, v, s: names.append(n))
    assert not {"confidence_head.proj.weight", "confidence_head.proj.bias"} & _changed(before0, d0)
    assert "train/base/confidence" not in names


def test_the_base_drafters_head_is_labelled_for_the_decoding_it_will_schedule(tmp_path, target, data, monkeypatch):
    """The head learns the acceptance of the decoding at train.loss.confidence_temperature (ready.train.loss):
    greedy by default, as eval.temperature; DeepSpec's sampling label at 1 when asked. Each run's loss gets its
    own label, and the two heads end apart."""
    import ready.train.stages as stages

    seen: list = []
    real = stages.draft_loss
    monkeypatch.setattr(stages, "draft_loss", lambda *a, **k: seen.append(k["confidence_temperature"]) or real(*a, **k))
    heads = {}
    for t in (None, 1.0):
        cfg = _with_head(micro_cfg(tmp_path))
        cfg.train.base.update(samples=32, lr=1e-2, anchors_per_sample=6)
        if t is not None:
            cfg.train.loss.confidence_temperature = t
        d = _drafter(cfg, target, reader=False)
        seen.clear()
        train_stage("base", d, target, data, cfg, tmp_path / f"base{t}", progress=False)
        assert seen and set(seen) == {0.0 if t is None else t}
        heads[t] = d.confidence_head.proj.bias.detach().clone()
    assert not torch.equal(heads[None], heads[1.0])


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
@pytest.mark.parametrize("reader", [True, False])
def test_readys_stages_and_the_control_leave_the_confidence_head_as_it_was(tmp_path, target, data, stage, reader):
    """As the paper leaves it: ReaDy's stages (and the FT control's) drop the head's loss and never train it."""
    cfg = _with_head(micro_cfg(tmp_path))
    d = _drafter(cfg, target, reader=reader)
    before = {n: p.detach().clone() for n, p in d.confidence_head.named_parameters()}
    names = []
    res = train_stage(stage, d, target, data, cfg, tmp_path / stage, progress=False,
                      callback=lambda n, v, s: names.append(n))
    assert not any("confidence_head" in n for n in res.trainable)
    assert all(torch.equal(p, before[n]) for n, p in d.confidence_head.named_parameters())
    assert not any(n.endswith("/confidence") for n in names)


def test_unknown_stage_and_lora_matching_nothing_say_what_was_expected(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    with pytest.raises(TrainStageError, match="stage1"):
        train_stage("stage3", _drafter(cfg, target, True), target, data, cfg, tmp_path / "x", progress=False)
    cfg.train.lora.target_modules = ["attn_qkv"]
    with pytest.raises(LoraSetupError, match="train.lora.target_modules"):
        train_stage("stage2", _drafter(cfg, target, True), target, data, cfg, tmp_path / "y", progress=False)


def test_the_state_placebo_trains_on_the_next_rows_states_at_its_own_anchors(tmp_path, target, data):
    """reader.states=shuffled: row b's reader gets row b+1's committed states at row b's positions."""
    from ready.train.teacher_pass import TeacherPassError, teacher_pass

    cfg = micro_cfg(tmp_path)
    own = _drafter(cfg, target, reader=True)
    placebo = DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"states": "shuffled"}), target)
    tokens = data.tokens[:3]
    anchors = torch.tensor([[13, 15], [14, 18], [16, 20]])
    mine = teacher_pass(target, own, tokens, anchors).states
    theirs = teacher_pass(target, placebo, tokens, anchors).states
    for b in range(3):
        nxt = (b + 1) % 3
        with torch.no_grad():
            ref = target(tokens[nxt:nxt + 1], state_layers=own.state_layers, state_positions=anchors[b:b + 1] - 1).states
        torch.testing.assert_close(theirs[b], ref[0], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(theirs[b], mine[b])
    with pytest.raises(TeacherPassError, match="at least 2 sequences"):
        teacher_pass(target, placebo, tokens[:1], anchors[:1])


def test_an_unreadable_resume_checkpoint_is_set_aside_and_the_stage_starts_over(tmp_path, target, data, capsys):
    cfg = micro_cfg(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "checkpoint.pt").write_bytes(b"\0garbage" * 64)  # a killed disk write, say
    res = train_stage("stage1", _drafter(cfg, target, reader=True), target, data, cfg, tmp_path / "work", progress=False)
    assert res.resumed_from == 0 and res.steps == len(res.losses)
    assert "ignoring unreadable checkpoint" in capsys.readouterr().out  # tqdm.write, beside the progress bar


class _Planted:
    """A pickle that, if it were ever unpickled, would leave a file behind (the probe used os.system)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_planted_as_the_resume_checkpoint_never_runs(tmp_path, target, data, capsys):
    cfg = micro_cfg(tmp_path)
    (tmp_path / "work").mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "payload": _Planted(marker)}, tmp_path / "work" / "checkpoint.pt")
    res = train_stage("stage1", _drafter(cfg, target, reader=True), target, data, cfg, tmp_path / "work", progress=False)
    assert not marker.exists()
    assert res.resumed_from == 0 and res.steps == len(res.losses)
    assert "ignoring unreadable checkpoint" in capsys.readouterr().out
