"""The embedded default target: tokenizer + `tiny` target pretrained on the embedded corpus, cached.

`ensure_default_target(cfg)` returns a folder that `ready.target.load_target`,
`transformers.AutoTokenizer` and `transformers.Qwen3_5ForCausalLM` all load:

    <artifacts_dir>/tokenizer/<hash>/   tokenizer.json, tokenizer_config.json, special_tokens*.json
    <artifacts_dir>/target/<hash>/      config.json, model.safetensors, the tokenizer files,
                                        metrics.json (held-out loss, train time, tokens seen, sample)

Each hash is that of everything the artifact is built from: the corpus config and the corpus
content fingerprint (tokenizer), plus the pretrain config and the preset architecture (target).
Builds go through `ready.artifacts.cached` (temp folder + rename + DONE marker), so a second call
is a cache hit and a killed build leaves nothing a later call trusts.

`training_prompts` / `heldout_prompts` cut prompts (token-id lists) out of the corpus splits for
the drafter trainer's target-regenerated data; the `validation` split (a tenth of the pretraining
files, never the drafter's training prompts) feeds the held-out teacher-forced metric.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import DictConfig, OmegaConf

from ready.artifacts import artifact_dir, cached
from ready.config import CorpusConfig
from ready.data.benchmarks import heldout_chat_suite
from ready.data.chat import render_text, template_overhead
from ready.data.corpus import Corpus, Doc, is_heldout, load_corpus
from ready.data.pretrain import greedy_continue, pretrain, token_stream
from ready.data.stdlib_chats import stdlib_conversations
from ready.data.tokenizer import build_tokenizer, load_tokenizer, special_token_ids
from ready.target import load_target, save_target
from ready.target.config import PRESETS, preset_config

if TYPE_CHECKING:
    import torch

# Bump when the build code changes what it produces, so old caches are not reused.
TOKENIZER_BUILD_VERSION = 2  # 2: always the chat variant (ChatML tokens + template)
TARGET_BUILD_VERSION = 2  # 2: pretrained on the standard library's conversations too (pretrain.chat_fraction)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "special_tokens.json")


class DefaultTargetError(ValueError):
    """The config asks for something the embedded default cannot build; the message says what."""


def _plain(section: Any) -> dict:
    """A config section (DictConfig or dataclass) as a plain dict."""
    if isinstance(section, DictConfig):
        return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
    if dataclasses.is_dataclass(section):
        return dataclasses.asdict(section)
    return dict(section)


def tokenizer_spec(cfg: Any, corpus: Optional[Corpus] = None) -> dict:
    corpus = corpus or load_corpus(cfg.corpus)
    return {"kind": "bpe-bytelevel", "version": TOKENIZER_BUILD_VERSION, "corpus": _plain(cfg.corpus),
            "corpus_fingerprint": corpus.fingerprint}


def ensure_tokenizer(cfg: Any, progress: bool = True) -> Path:
    """The default tokenizer folder, trained on the corpus's train split on first use."""
    corpus = load_corpus(cfg.corpus)
    spec = tokenizer_spec(cfg, corpus)

    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        if progress:
            print(f"[ready] training the byte-level BPE ({cfg.corpus.vocab_size} tokens) on "
                  f"{len(corpus.train)} files of {corpus.source} ({corpus.train_bytes() / 1e6:.1f} MB)", file=sys.stderr, flush=True)
        ids = build_tokenizer(corpus.train, int(cfg.corpus.vocab_size), tmp, chat=True)
        ids["build_time_s"] = time.perf_counter() - t0
        (tmp / "special_tokens.json").write_text(json.dumps(ids, indent=2) + "\n")

    return cached(cfg.artifacts_dir, "tokenizer", spec, build)


def _preset(cfg: Any) -> str:
    source = str(cfg.target.source)
    if source not in PRESETS:
        raise DefaultTargetError(
            f"bad value at key 'target.source': {source!r}; the embedded default pretrains a preset "
            f"(one of {sorted(PRESETS)}), a checkpoint directory is loaded as it is")
    return source


def _arch_overrides(cfg: Any, tokenizer_dir: Path) -> dict[str, int]:
    """The preset's fields this build sets: the tokenizer's sizes and ids, and the attention window."""
    ids = json.loads((tokenizer_dir / "special_tokens.json").read_text())
    out = {"vocab_size": int(ids["vocab_size"]), "eos_token_id": int(ids["eos_token_id"]),
           "pad_token_id": int(ids["pad_token_id"])}
    window = int(cfg.target.attention_window)
    if window:  # absent at 0: the spec (the target's cache key) stays what it was before the knob
        out["sliding_window"] = window
    return out


def target_spec(cfg: Any, tokenizer_dir: Optional[Path] = None) -> dict:
    """What the pretrained target is built from (its cache key)."""
    preset = _preset(cfg)
    tok_dir = tokenizer_dir or ensure_tokenizer(cfg, progress=False)
    arch = preset_config(preset, _arch_overrides(cfg, tok_dir)).to_hf_dict()
    return {"version": TARGET_BUILD_VERSION, "tokenizer": tokenizer_spec(cfg), "preset": preset,
            "architecture": arch, "pretrain": _pretrain_spec(cfg.pretrain), "threads": int(cfg.threads.shared)}


def _pretrain_spec(pretrain: Any) -> dict:
    """The pretraining knobs; `repeat_fraction` only when > 0, so earlier targets keep their cache keys."""
    out = _plain(pretrain)
    if not out.get("repeat_fraction"):
        out.pop("repeat_fraction", None)
    return out


def default_target_dir(cfg: Any) -> Path:
    """Where `ensure_default_target(cfg)` puts (or has put) the target; builds nothing but the tokenizer."""
    return artifact_dir(cfg.artifacts_dir, "target", target_spec(cfg))


def ensure_default_target(cfg: Any, progress: bool = True) -> Path:
    """Folder of the pretrained default target (HF format, with tokenizer); built on first use."""
    import torch

    tok_dir = ensure_tokenizer(cfg, progress=progress)
    spec = target_spec(cfg, tok_dir)

    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        corpus = load_corpus(cfg.corpus)
        tokenizer = load_tokenizer(tok_dir)
        eos = special_token_ids(tokenizer)["eos_token_id"]
        train = token_stream(corpus.train, tokenizer, eos)
        held = token_stream(corpus.heldout, tokenizer, eos)
        chats = chat_stream(list(corpus.train), tokenizer, int(cfg.pretrain.seq_len), int(cfg.pretrain.seed), eos)
        torch.manual_seed(int(cfg.pretrain.seed))
        model = load_target(spec["preset"], overrides=_arch_overrides(cfg, tok_dir), device="cpu", dtype=torch.float32)
        if progress:
            n = sum(p.numel() for p in model.parameters())
            print(f"[ready] pretraining the '{spec['preset']}' target ({n / 1e6:.1f}M params) on "
                  f"{train.numel() / 1e6:.2f}M train tokens: {cfg.pretrain.steps} steps x "
                  f"{cfg.pretrain.batch_size} x {cfg.pretrain.seq_len}", file=sys.stderr, flush=True)
        metrics = pretrain(model, train, held, cfg.pretrain, progress=progress, chats=chats)
        sample = heldout_chat_suite(tokenizer, cfg.corpus, 1, 64, thinking=False)[0]
        cont = greedy_continue(model, sample.ids, int(cfg.pretrain.sample_tokens))
        metrics["sample"] = {"id": sample.id, "prompt_ids": sample.ids, "continuation_ids": cont,
                             "prompt": sample.text, "continuation": tokenizer.decode(cont)}
        saved = save_target(model, tmp / "model", tokenizer=None)
        for f in saved.iterdir():
            os.replace(f, tmp / f.name)
        saved.rmdir()
        for name in TOKENIZER_FILES:
            shutil.copy2(tok_dir / name, tmp / name)
        metrics["build_time_s"] = time.perf_counter() - t0
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        if progress:
            print(f"[ready] target pretrained: held-out loss {metrics['heldout_loss']:.3f} "
                  f"in {metrics['build_time_s']:.0f}s", file=sys.stderr, flush=True)

    return cached(cfg.artifacts_dir, "target", spec, build)


def chat_stream(docs: list[Doc], tokenizer: Any, seq_len: int, seed: int, eos_id: int) -> "torch.Tensor":
    """The corpus's conversations of `docs` with their own answers (ready.data.stdlib_chats),
    rendered with the chat template (thinking off, as evaluation renders by default) and concatenated,
    EOS after each: the stream `pretrain.chat_fraction` of the target's windows come from. A user turn
    holds up to half a window, an answer the rest."""
    half = max(1, (seq_len - template_overhead(tokenizer, False)) // 2)
    convs = stdlib_conversations(docs, tokenizer, half, half, seed)
    texts = [render_text(tokenizer, m, thinking=False) for m in convs]
    return token_stream([Doc(path=f"chat/{i}", text=t) for i, t in enumerate(texts)], tokenizer, eos_id)


def default_metrics(target_dir: str | Path) -> dict:
    """The metrics.json written with a default target."""
    return json.loads((Path(target_dir) / "metrics.json").read_text())


# Share of the target's pretraining files whose prompts are kept out of the drafter's training:
# the validation split (held-out regenerated sequences for the teacher-forced tau and the loss
# search), disjoint from the drafter's training prompts and from the evaluation suites.
VALIDATION_FRACTION = 0.1


def prompt_docs(corpus: Corpus, split: str, seed: int) -> list:
    """Corpus files the prompts of `split` are cut from, by path.

    `train` (the drafter's training prompts) and `validation` divide the target's pretraining
    files between them, file by file; `heldout` is the held-out split (the `heldout` suite)."""
    if split in ("train", "validation"):
        docs = [d for d in corpus.train if is_heldout(d.path, VALIDATION_FRACTION, seed + 1) == (split == "validation")]
    else:
        docs = list(corpus.split(split))
    return sorted(docs, key=lambda d: d.path)


def _prompts(tokenizer: Any, regen: Any, corpus_cfg: Any, split: str) -> list[list[int]]:
    corpus = load_corpus(corpus_cfg)
    docs = prompt_docs(corpus, split, int(corpus_cfg.seed) if not isinstance(corpus_cfg, dict) else int(corpus_cfg["seed"]))
    if not docs:
        raise ValueError(f"corpus split {split!r} has no files; raise corpus.max_files")
    weights = [len(d.text) for d in docs]
    n, plen = int(regen.num_samples), int(regen.prompt_len)
    if n < 0 or plen < 1:
        raise ValueError(f"bad regen config: num_samples={n}, prompt_len={plen}; expected >= 0 and >= 1")
    rng = random.Random(f"{regen.seed}:{split}")
    out: list[list[int]] = []
    misses = 0
    while len(out) < n:
        doc = rng.choices(docs, weights=weights)[0]
        hi = max(0, len(doc.text) - plen * 4)
        pos = rng.randint(0, hi)
        start = doc.text.rfind("\n", 0, pos) + 1
        ids = list(tokenizer(doc.text[start:start + plen * 16], add_special_tokens=False)["input_ids"])[:plen]
        if len(ids) == plen:
            out.append(ids)
            continue
        misses += 1
        if misses > 100 * max(1, n):
            raise ValueError(f"corpus split {split!r} has no text of {plen} tokens; lower regen.prompt_len")
    return out


def training_prompts(tokenizer: Any, regen: Any, split: str = "train",
                     corpus_cfg: Any = None) -> list[list[int]]:
    """`regen.num_samples` prompts of `regen.prompt_len` token ids, each starting at a line start
    of a corpus file of `split` (`train`, `validation` or `heldout`, see `prompt_docs`; files drawn
    in proportion to their length), fixed by `regen.seed`.

    `corpus_cfg` defaults to `CorpusConfig()`; pass `cfg.corpus` when the run changes it.
    """
    return _prompts(tokenizer, regen, corpus_cfg if corpus_cfg is not None else CorpusConfig(), split)


def heldout_prompts(tokenizer: Any, regen: Any, corpus_cfg: Any = None) -> list[list[int]]:
    """Like `training_prompts`, from the held-out split (for measuring on unseen text)."""
    return training_prompts(tokenizer, regen, "heldout", corpus_cfg)


__all__ = ["ensure_default_target", "ensure_tokenizer", "default_target_dir", "default_metrics",
           "training_prompts", "heldout_prompts", "target_spec", "tokenizer_spec"]
