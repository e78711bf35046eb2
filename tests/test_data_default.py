"""The embedded default target: built once from an empty cache, reused, never trusted half-built,
and loadable by plain transformers."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import ready.data.default as default_mod
import ready.data.pretrain as pretrain_mod
from ready.artifacts import DONE
from ready.config import Config, CorpusConfig, PretrainConfig, RegenConfig
from ready.data.corpus import load_corpus
from ready.data.default import (DefaultTargetError, default_target_dir, ensure_default_target, heldout_prompts,
                                target_spec, training_prompts)
from ready.data.tokenizer import load_tokenizer

# A small slice of the corpus and a few optimizer steps: the whole build takes seconds.
SMALL_CORPUS = dict(max_files=60, heldout_fraction=0.2, vocab_size=512)
FEW_STEPS = dict(steps=4, batch_size=2, seq_len=32, lr=3e-3, heldout_windows=2, sample_tokens=8)


def small_cfg(root: Path, **pretrain):
    return OmegaConf.structured(Config(artifacts_dir=str(root), corpus=CorpusConfig(**SMALL_CORPUS),
                                       pretrain=PretrainConfig(**{**FEW_STEPS, **pretrain})))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_target(small_cfg(tmp_path_factory.mktemp("artifacts")), progress=False)


def test_one_call_builds_tokenizer_and_pretrained_target(built: Path) -> None:
    names = {p.name for p in built.iterdir()}
    assert {DONE, "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "metrics.json", "spec.json"} <= names
    metrics = json.loads((built / "metrics.json").read_text())
    assert metrics["tokens_seen"] == 4 * 2 * 32 and metrics["steps"] == 4
    assert 0 < metrics["heldout_loss"] < 1.5 * torch.log(torch.tensor(512.0)).item()
    assert len(metrics["sample"]["continuation_ids"]) == 8
    assert (built.parent.parent / "tokenizer").is_dir()


def test_second_call_is_a_cache_hit(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_train(*a, **k):
        raise AssertionError("the cached target was rebuilt")

    monkeypatch.setattr(default_mod, "pretrain", must_not_train)
    assert ensure_default_target(small_cfg(built.parent.parent), progress=False) == built


def test_a_build_killed_midway_leaves_nothing_trusted_and_a_rerun_completes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          built: Path) -> None:
    cfg = small_cfg(tmp_path)
    shutil.copytree(built.parent.parent / "tokenizer", tmp_path / "tokenizer")  # only the target is rebuilt
    real = pretrain_mod.pretrain

    def killed(*a, **k):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(default_mod, "pretrain", killed)
    with pytest.raises(KeyboardInterrupt):
        ensure_default_target(cfg, progress=False)
    final = default_target_dir(cfg)
    assert not final.exists() and not list(final.parent.iterdir())  # no half-built folder left behind

    # a hard kill (no cleanup) leaves a temp folder and maybe a final folder without DONE
    (final.parent / f".{final.name}.tmp-dead").mkdir()
    final.mkdir()
    (final / "config.json").write_text("{}")
    monkeypatch.setattr(default_mod, "pretrain", real)
    out = ensure_default_target(cfg, progress=False)
    assert out == final and (out / DONE).is_file()
    assert (out / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()


def test_transformers_loads_the_artifacts_and_reproduces_our_greedy_continuation(built: Path) -> None:
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    from ready.target import load_target

    sample = json.loads((built / "metrics.json").read_text())["sample"]
    tok = AutoTokenizer.from_pretrained(str(built))
    hf = Qwen3_5ForCausalLM.from_pretrained(str(built), dtype=torch.float32).eval()
    ours = load_target(str(built))
    prompt = torch.tensor([sample["prompt_ids"]])
    with torch.no_grad():
        hf_logits = hf(prompt).logits
        assert torch.allclose(hf_logits, ours(prompt).logits, atol=1e-4, rtol=1e-4)
        gen = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id,
                          eos_token_id=None)
    assert gen[0, prompt.shape[1]:].tolist() == sample["continuation_ids"]
    assert tok.decode(sample["continuation_ids"]) == sample["continuation"]
    assert tok.eos_token_id == hf.config.eos_token_id


def test_cache_key_follows_what_the_target_is_built_from(tmp_path: Path) -> None:
    base = small_cfg(tmp_path)
    other_reader = small_cfg(tmp_path)
    other_reader.reader.rank = 64
    assert target_spec(base) == target_spec(other_reader)
    assert target_spec(base) != target_spec(small_cfg(tmp_path, steps=5))
    assert "repeat_fraction" not in target_spec(base)["pretrain"]  # at 0: earlier targets keep their folders
    assert target_spec(small_cfg(tmp_path, repeat_fraction=0.5))["pretrain"]["repeat_fraction"] == 0.5
    more_vocab = small_cfg(tmp_path)
    more_vocab.corpus.vocab_size = 600
    assert target_spec(more_vocab)["architecture"]["vocab_size"] == 600
    one_thread = small_cfg(tmp_path)
    one_thread.threads.shared = 1  # pretraining adds in another order on one thread: another target
    assert target_spec(base)["threads"] == 2 and target_spec(one_thread)["threads"] == 1


def test_a_checkpoint_path_is_not_something_the_default_builder_pretrains(tmp_path: Path) -> None:
    cfg = small_cfg(tmp_path)
    cfg.target.source = str(tmp_path)
    with pytest.raises(DefaultTargetError, match="target.source"):
        ensure_default_target(cfg, progress=False)


def test_training_prompts_are_deterministic_full_length_cuts_of_their_split(built: Path) -> None:
    tok = load_tokenizer(built)
    corpus_cfg = CorpusConfig(**SMALL_CORPUS)
    regen = RegenConfig(num_samples=6, prompt_len=24, seed=5)
    a = training_prompts(tok, regen, corpus_cfg=corpus_cfg)
    assert a == training_prompts(tok, regen, corpus_cfg=corpus_cfg)
    assert len(a) == 6 and all(len(p) == 24 for p in a)
    assert a != training_prompts(tok, RegenConfig(num_samples=6, prompt_len=24, seed=6), corpus_cfg=corpus_cfg)
    corpus = load_corpus(corpus_cfg)
    held = heldout_prompts(tok, regen, corpus_cfg=corpus_cfg)
    for prompts, docs in ((a, corpus.train), (held, corpus.heldout)):
        for p in prompts:
            text = tok.decode(p).rstrip("\ufffd")
            assert any(text in d.text for d in docs)


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = PretrainConfig(steps=100, lr=1e-3, warmup=0.1, min_lr_ratio=0.1)
    lrs = [pretrain_mod.lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(x >= y for x, y in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)
