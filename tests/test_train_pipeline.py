"""The per-variant pipeline on a micro random target: cached data and base drafter, two stages,
the no-state control, resume after a kill, loadable results."""

import json

import pytest
import torch

from ready.drafter import load_drafter
from ready.train import RegenData, build_regen_data, greedy_responses, read_train_log, train_variant
from ready.train.pipeline import PipelineError, ensure_base_drafter
from ready.train.regen import RegenError
from test_train_helpers import micro_cfg, micro_prompts, micro_target




P = micro_prompts(16, 12)  # the training prompts (micro_cfg: 16 of 12 tokens), continued by the target


@pytest.fixture()
def target():
    return micro_target()


def test_regenerated_data_is_the_targets_greedy_continuation_and_is_cached(tmp_path, target):
    cfg = micro_cfg(tmp_path)
    data, folder = build_regen_data(cfg, target, None, prompts=P, progress=False)
    assert data.tokens.shape == (16, 24) and data.prompt_len == 12
    assert torch.equal(data.tokens[:, :12], micro_prompts(16, 12))
    ids = data.tokens[:3, :12]
    with torch.no_grad():  # greedy without the cache, one token at a time
        for _ in range(12):
            ids = torch.cat([ids, target(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(ids, data.tokens[:3])
    again, folder2 = build_regen_data(cfg, target, None, prompts=P, progress=False)
    assert folder2 == folder and torch.equal(again.tokens, data.tokens)
    assert len(list((tmp_path / "artifacts" / "regen").iterdir())) == 1
    cfg.regen.response_len = 8  # another config: another artifact
    _, folder3 = build_regen_data(cfg, target, None, prompts=P, progress=False)
    assert folder3 != folder


def test_eos_ends_a_response_and_the_rest_is_padding(target):
    prompts = micro_prompts(4, 6)
    free = greedy_responses(target, prompts, 10, eos_id=None, progress=False)
    eos = int(free.tokens[0, 9])  # the token the target emits 4th in row 0
    data = greedy_responses(target, prompts, 10, eos_id=eos, progress=False)
    first = int((free.tokens[0, 6:] == eos).nonzero()[0])
    assert int(data.lengths[0]) == 6 + first + 1
    assert bool((data.tokens[0, 6 + first:] == eos).all())


def test_bad_prompts_and_missing_data_say_what_was_expected(tmp_path, target):
    cfg = micro_cfg(tmp_path)
    with pytest.raises(RegenError, match="regen.prompt_len"):
        build_regen_data(cfg, target, None, prompts=micro_prompts(4, 7), progress=False)
    with pytest.raises(RegenError, match="equal-length"):
        build_regen_data(cfg, target, None, prompts=[[1, 2, 3], [1, 2]], progress=False)
    with pytest.raises(RegenError, match="does not exist"):
        RegenData.load(tmp_path / "nowhere.pt")
    cfg.drafter.checkpoint = str(tmp_path / "no_drafter")
    with pytest.raises(PipelineError, match="drafter.checkpoint"):
        ensure_base_drafter(cfg, target, None, prompts=P, progress=False)


def test_variant_trains_base_then_both_stages_and_reuses_everything_on_a_rerun(tmp_path, target):
    cfg = micro_cfg(tmp_path)
    seen = []
    final = train_variant(cfg, target, None, None, tmp_path / "v_ready", callback=lambda n, v, s: seen.append(n), prompts=P)
    assert {n.split("/")[1] for n in seen} == {"base", "stage1", "stage2"}
    drafter = load_drafter(final, target)
    assert drafter.state_layers and drafter.reader_parameters()
    log = read_train_log(final)
    assert log["stage"] == "stage2" and all(".lora_" in n or n.startswith("readers.") for n in log["trainable"])
    stage1 = read_train_log(next((tmp_path / "v_ready").glob("stage1-*")) / "drafter")
    assert all(n.startswith("readers.") for n in stage1["trainable"])
    assert not list((tmp_path / "v_ready").glob("*.work"))  # checkpoints cleaned up once finished

    again = []
    assert train_variant(cfg, target, None, None, tmp_path / "v_ready", callback=lambda *a: again.append(a), prompts=P) == final
    assert again == []  # nothing retrained

    cfg.reader.enabled = False  # the no-state control shares the base drafter
    control = train_variant(cfg, target, None, None, tmp_path / "v_ctrl", callback=lambda n, v, s: seen.append(n), prompts=P)
    bases = [p for p in (tmp_path / "artifacts" / "drafter_base").iterdir() if not p.name.endswith(".work")]
    assert len(bases) == 1
    assert load_drafter(control, target).state_layers == []
    for stage in ("stage1", "stage2"):
        log = read_train_log(next((tmp_path / "v_ctrl").glob(f"{stage}-*")) / "drafter")
        assert log["trainable"] and all(".lora_" in n for n in log["trainable"])
        assert log["steps"] == read_train_log(next((tmp_path / "v_ready").glob(f"{stage}-*")) / "drafter")["steps"]


def test_each_build_runs_on_the_threads_its_config_names_and_the_count_keys_its_folder(tmp_path, target, monkeypatch):
    """CPU sums add in a thread-dependent order, so the counts are config keys, not the process's:
    the regenerated data on threads.shared, the base drafter and the stages on threads.drafters."""
    import ready.train.regen as regen

    cfg = micro_cfg(tmp_path)
    cfg.threads.shared, cfg.threads.drafters = 3, 2
    before = torch.get_num_threads()
    seen = {"regen": set(), "train": set()}
    greedy = regen.greedy_responses

    def recording_greedy(*a, **k):
        seen["regen"].add(torch.get_num_threads())
        return greedy(*a, **k)

    monkeypatch.setattr(regen, "greedy_responses", recording_greedy)
    train_variant(cfg, target, None, None, tmp_path / "v", callback=lambda *a: seen["train"].add(torch.get_num_threads()),
                  prompts=P)
    assert seen == {"regen": {3}, "train": {2}} and torch.get_num_threads() == before
    (data_spec,) = [json.loads(f.read_text()) for f in (tmp_path / "artifacts" / "regen").glob("*/spec.json")]
    assert data_spec["threads"] == 3

    cfg.threads.drafters = 1  # another count: another base drafter, never the one built on 2 threads
    train_variant(cfg, target, None, None, tmp_path / "v1", prompts=P)
    bases = [p for p in (tmp_path / "artifacts" / "drafter_base").iterdir() if not p.name.startswith(".")]
    assert sorted(json.loads((b / "spec.json").read_text())["threads"] for b in bases) == [1, 2]


def test_a_killed_variant_resumes_its_stage_from_the_checkpoint(tmp_path, target):
    cfg = micro_cfg(tmp_path)
    base = ensure_base_drafter(cfg, target, None, prompts=P, progress=False)

    def kill(name, value, step):
        if name == "train/stage2/loss" and step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_variant(cfg, target, None, base, tmp_path / "v", callback=kill, progress=False, prompts=P)
    assert list((tmp_path / "v").glob("stage1-*/DONE")) and not list((tmp_path / "v").glob("stage2-*/DONE"))
    assert list((tmp_path / "v").glob("stage2-*.work/checkpoint.pt"))
    final = train_variant(cfg, target, None, base, tmp_path / "v", progress=False, prompts=P)
    log = read_train_log(final)
    assert log["resumed_from"] == 4 and len(log["losses"]) == log["steps"] == 6
    uninterrupted = train_variant(cfg, target, None, base, tmp_path / "w", progress=False, prompts=P)
    a = load_drafter(final, target).state_dict()
    b = load_drafter(uninterrupted, target).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((final.parent / "spec.json").read_text())["kind"] == "stage2"
