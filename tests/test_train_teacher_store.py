"""The teacher store: its rows are the teacher passes bit for bit, so a base drafter trained from it is the same."""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import ready.train.stages as stages
from ready.drafter import DSparkDrafter
from ready.train import greedy_responses, train_stage
from ready.train.anchors import sample_anchors
from ready.train.pipeline import ensure_base_drafter
from ready.train.teacher_store import KIND, STORE_FILE, TeacherStore, ensure_teacher_store
from ready.train.teacher_pass import teacher_pass
from test_train_helpers import micro_cfg, micro_prompts, micro_target


@pytest.fixture(scope="module")
def target():
    return micro_target()


@pytest.fixture(scope="module")
def data(target):  # 13 sequences: the store's last batch is a short one
    return greedy_responses(target, micro_prompts(13, 12), 12, eos_id=None, batch_size=8, progress=False)

P = micro_prompts(16, 12)  # the training prompts (micro_cfg: 16 of 12 tokens), continued by the target


def _drafter(cfg, target, reader: bool = False) -> DSparkDrafter:
    torch.manual_seed(0)
    return DSparkDrafter(cfg.drafter, OmegaConf.merge(cfg.reader, {"enabled": reader}), target)


def _same(a, b) -> bool:
    return (a.start == b.start and b.states is None and torch.equal(a.hidden, b.hidden)
            and torch.equal(a.logits, b.logits))


@pytest.mark.parametrize("batch, capture", [(8, None), (4, None), (8, (-1, 0, 3, 7))])
def test_the_stores_rows_are_the_teacher_pass_bit_for_bit_whatever_the_batch(tmp_path, target, data, batch, capture):
    drafter = _drafter(micro_cfg(tmp_path), target)
    if capture is not None:  # embeddings and the last layer too
        drafter = SimpleNamespace(capture_layers=list(capture), state_layers=[])
    torch.set_num_threads(2)  # built with 2 threads, as the shared artifacts are; asked with 1
    try:
        store = TeacherStore.build(target, data, drafter.capture_layers, batch, progress=False)
    finally:
        torch.set_num_threads(1)
    assert store.exact(target)
    g = torch.Generator().manual_seed(5)
    for _ in range(6):
        idx = torch.randperm(len(data), generator=g)[:batch]  # other sequences, in other slots
        for anchors_per_sample in (1, 3):
            anchors, _ = sample_anchors(data.trainable(idx), 4, anchors_per_sample, g)
            direct = teacher_pass(target, drafter, data.tokens[idx], anchors, keep=False)
            assert _same(direct, store.teacher_pass(target, idx, anchors)), (idx.tolist(), anchors.tolist())


def test_a_store_that_a_vector_tail_would_change_serves_nothing(tmp_path, target, monkeypatch):
    # A vector tail makes a row round by its batch slot (on AVX-512 an elementwise op's last elements
    # at T = 23 fall in its scalar tail; AVX2 CPUs round those the same). So that the check is tested
    # on every CPU, a hook gives the last of 8 slots the same kind of one-ulp difference.
    def last_slot_rounds_otherwise(module, args, out):
        if out.shape[0] == 8:
            out = out.clone()
            out[-1] = torch.nextafter(out[-1], torch.full_like(out[-1], float("inf")))
        return out

    hook = target.model.embed_tokens.register_forward_hook(last_slot_rounds_otherwise)
    try:
        odd = greedy_responses(target, micro_prompts(16, 12), 11, eos_id=None, batch_size=8, progress=False)
        cfg = micro_cfg(tmp_path, base={"samples": 32, "batch_size": 8, "lr": 3e-3, "anchors_per_sample": 3})
        drafter = _drafter(cfg, target)
        store = TeacherStore.build(target, odd, drafter.capture_layers, 8, progress=False)
        with torch.no_grad():
            moved = [(target(odd.tokens[ids], capture_layers=drafter.capture_layers, logits_from=None).hidden, ids)
                     for ids in (store.ids(0).roll(r) for r in range(1, 8))]
        assert not all(torch.equal(h, store.features[ids]) for h, ids in moved)  # what the store would have changed
        assert not store.exact(target) and not store.serves(target, drafter, odd, 8)
        passes = []
        monkeypatch.setattr(stages, "teacher_pass", lambda *a, **k: passes.append(1) or teacher_pass(*a, **k))
        res = train_stage("base", drafter, target, odd, cfg, tmp_path / "base", progress=False, store=store)
        assert len(passes) == res.steps == 4  # every pass ran afresh
    finally:
        hook.remove()


def test_a_base_drafter_trained_from_the_store_is_the_one_trained_without(tmp_path, target, data, monkeypatch):
    cfg = micro_cfg(tmp_path)
    plain = _drafter(cfg, target)
    res_plain = train_stage("base", plain, target, data, cfg, tmp_path / "plain", progress=False)
    store = TeacherStore.build(target, data, plain.capture_layers, int(cfg.train.base.batch_size), progress=False)
    passes = []
    monkeypatch.setattr(stages, "teacher_pass", lambda *a, **k: passes.append(1) or teacher_pass(*a, **k))
    stored = _drafter(cfg, target)
    res_stored = train_stage("base", stored, target, data, cfg, tmp_path / "stored", progress=False, store=store)
    assert passes == []  # every pass came from the store
    assert res_stored.losses == res_plain.losses
    a, b = plain.state_dict(), stored.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_store_serves_only_what_it_equals(tmp_path, target, data):
    cfg = micro_cfg(tmp_path)
    drafter = _drafter(cfg, target)
    store = TeacherStore.build(target, data, drafter.capture_layers, 8, progress=False)
    assert store.first == data.prompt_len - 1
    assert store.features.shape == (13, 24, len(drafter.capture_layers), 32) and store.normed.shape == (13, 13, 32)
    assert store.serves(target, drafter, data, 8)
    assert not store.serves(target, drafter, data, 4)  # passes of another shape
    assert not store.serves(target, _drafter(cfg, target, reader=True), data, 8)  # reads state
    assert not store.serves(target, SimpleNamespace(capture_layers=[1], state_layers=[]), data, 8)
    other = greedy_responses(target, micro_prompts(13, 12, seed=2), 12, eos_id=None, progress=False)
    assert not store.serves(target, drafter, other, 8)
    assert not store.serves(micro_target(seed=3), drafter, data, 8)
    changed = micro_target()
    with torch.no_grad():
        next(changed.model.layers[2].parameters()).view(-1)[0] += 1e-3  # one weight of one layer, slightly
    assert not store.serves(changed, drafter, data, 8)
    early = torch.full((1, 2), data.prompt_len - 2)  # an anchor before the stored positions: no answer
    assert store.teacher_pass(target, torch.tensor([0]), early) is None


def test_the_store_is_cached_verified_and_read_by_the_base_drafter(tmp_path, monkeypatch):
    target = micro_target()
    cfg = micro_cfg(tmp_path)
    assert ensure_teacher_store(cfg, target, None, prompts=P, progress=False, build=False) is None  # none built yet
    store = ensure_teacher_store(cfg, target, None, prompts=P, progress=False)
    features, normed = store.features.clone(), store.normed.clone()  # (the store maps its file)
    folders = list((tmp_path / "artifacts" / KIND).iterdir())
    assert len(folders) == 1 and (folders[0] / "DONE").is_file()
    assert ensure_teacher_store(cfg, target, None, prompts=P, progress=False, build=False) is not None

    path = folders[0] / STORE_FILE
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # a flipped byte: the store is never trusted, but built again
    path.write_bytes(bytes(raw))
    rebuilt = ensure_teacher_store(cfg, target, None, prompts=P, progress=False)
    assert torch.equal(rebuilt.features, features) and torch.equal(rebuilt.normed, normed)

    passes = []
    monkeypatch.setattr(stages, "teacher_pass", lambda *a, **k: passes.append(1) or teacher_pass(*a, **k))
    ensure_base_drafter(cfg, target, None, prompts=P, progress=False)
    assert passes == []  # the base drafter's passes all came from the store
    assert len(list((tmp_path / "artifacts" / KIND).iterdir())) == 1

    cfg.drafter.checkpoint = str(tmp_path / "given")  # no base to train: nothing to build
    assert ensure_teacher_store(OmegaConf.merge(cfg, {"artifacts_dir": str(tmp_path / "b")}), target, None,
                                progress=False) is None
