"""From a config to a loaded target: the one way the sweeps and the diagnostics get theirs.

`load_configured_target(cfg)` resolves `target.device` (`pick_device`) and `target.source`
(`target_dir`: the pretrained embedded default, a local checkpoint, or a bare preset), loads the
target frozen in `target.dtype` and the exact mode the config asks for, and its tokenizer and
EOS id. A sweep row (`sweeps.row`) and every held-out diagnostic (`benchmarks.diagnostics`) start here,
so they measure the same target the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from ready.artifacts import content_id
from ready.config import compile_in_graphs, config_hash, exact_mode
from ready.data import ensure_default_target, ensure_tokenizer
from ready.data.conversation_files import ConversationError, find_files
from ready.data.corpus import load_corpus
from ready.data.tokenizer import load_tokenizer
from ready.memo import MEMO
from ready.target import load_target
from ready.target.config import PRESETS


WEIGHT_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json")  # what decides a model's outputs


def weights_id(path: str | Path) -> str:
    """A model folder by the content of what decides its outputs (`WEIGHT_FILES`, not its build logs with
    timings): a copied or moved folder keeps its id, rebuilt weights get another. A name that is no folder
    (a preset) stands for itself."""
    return content_id(path, WEIGHT_FILES) if Path(path).is_dir() else str(path)


class PipelineConfigError(ValueError):
    """A run asks for something the pipeline cannot do; the message names the key."""


@dataclass
class LoadedTarget:
    """A config's target, frozen, with its tokenizer, EOS id, the folder (or preset) it came from and its device."""

    target: Any
    tokenizer: Any
    eos: Optional[int]
    target_path: str
    device: str


def pick_device(cfg: DictConfig) -> str:
    """`target.device` resolved: `auto` is CUDA when visible; `cuda` without a GPU is a PipelineConfigError."""
    want = str(cfg.target.device)
    if want == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise PipelineConfigError("bad value at key 'target.device': 'cuda' but no CUDA device is visible; "
                                  "expected 'cpu' or 'auto' on this machine")
    return want


def target_dir(cfg: DictConfig, progress: bool = True) -> str:
    """The target to load: the pretrained embedded default, a local checkpoint, or a bare preset."""
    source = str(cfg.target.source)
    window = int(cfg.target.attention_window)
    if window and not (source in PRESETS and cfg.target.pretrain):
        raise PipelineConfigError(
            f"bad value at key 'target.attention_window': {window}; a window is pretrained into the embedded "
            f"target (a preset with target.pretrain true), but target.source is {source!r} with "
            f"target.pretrain {bool(cfg.target.pretrain)}: expected 0 (a checkpoint's attention is as it was trained)")
    if source in PRESETS:
        if cfg.target.pretrain:
            return str(ensure_default_target(cfg, progress=progress))
        return source  # architecture only (random weights): for shape checks, not measurements
    path = Path(source).expanduser()
    if not path.is_dir():
        raise PipelineConfigError(f"bad value at key 'target.source': {source!r} is neither a preset "
                                  f"({', '.join(sorted(PRESETS))}) nor a local checkpoint directory")
    return str(path)


def inputs_identity(cfg: DictConfig) -> dict[str, str]:
    """What decides a run's numbers beside its config: the corpus's digest (the pinned package's sources,
    ready.data.corpus, from which the embedded target, its tokenizer, the default training prompts and the
    held-out suite are made: the same on every install, and another when the pin moves) and, for a
    checkpoint folder, its weights' content; a conversation dataset's (`data.path`) and benchmark files'
    (`bench.paths`) stamps. A sweep setting includes it, so runs made from other inputs are never reused
    or paired with these."""
    out = {"corpus": load_corpus(cfg.corpus).fingerprint[:16]}
    source = Path(str(cfg.target.source)).expanduser()
    if str(cfg.target.source) not in PRESETS and source.is_dir():
        out["target_weights"] = weights_id(source)
    if cfg.data.path:
        try:
            out["data_files"] = _files_stamp(find_files(str(cfg.data.path)))
        except ConversationError:
            pass  # the row that reads it says what is wrong
    bench = [Path(p) for p in cfg.bench.paths.values() if Path(p).is_file()]  # which suite reads which is config
    if bench:
        out["bench_files"] = _files_stamp(bench)
    return out


def _files_stamp(files: list[Path]) -> str:
    """Files by name, size and modification time: cheap on a dataset of gigabytes, and changed whenever a
    file is rewritten (the artifacts built from them are keyed by their sha256)."""
    stats = {str(f): f.stat() for f in files}
    return config_hash({name: [st.st_size, st.st_mtime_ns] for name, st in stats.items()}, length=16)


def load_configured_target(cfg: DictConfig, progress: bool = True) -> LoadedTarget:
    """The config's target (built first when it is the embedded default), frozen, in the config's
    dtype, device, exact mode and compile setting, with its tokenizer and EOS id (the checkpoint's, else
    the tokenizer's). The process's memo of target passes takes `train.teacher_memo_gb` (ready.memo)."""
    device = pick_device(cfg)
    path = target_dir(cfg, progress=progress)
    dtype = getattr(torch, str(cfg.target.dtype))
    if Path(path).is_dir():
        target, tokenizer = load_target(path, device=device, dtype=dtype), load_tokenizer(path)
    else:  # a preset with target.pretrain=false: its architecture, random weights, the embedded tokenizer
        target, tokenizer = random_target(cfg, path, device, dtype, progress)
    configure_target(target, cfg)
    for p in target.parameters():
        p.requires_grad_(False)
    eos = target.config.eos_token_id if target.config.eos_token_id is not None else tokenizer.eos_token_id
    return LoadedTarget(target, tokenizer, None if eos is None else int(eos), path, device)


def configure_target(target: Any, cfg: DictConfig) -> None:
    """The run's settings of a loaded target: exact mode (AR reference and drafting rows decode in the same
    mode), torch.compile inside its CUDA graphs, and the process's memo budget. A target kept across rows
    (sweeps.row) is configured anew for each."""
    target.exact = exact_mode(cfg)
    target.compile_in_graphs = compile_in_graphs(cfg)
    MEMO.configure(float(cfg.train.teacher_memo_gb))


RANDOM_WEIGHTS_SEED = 0  # every process builds the same random target (the artifacts name it by its preset)


def random_target(cfg: DictConfig, preset: str, device: str, dtype: torch.dtype, progress: bool = True) -> tuple[Any, Any]:
    """(target, tokenizer) of a preset with `target.pretrain=false`: the preset's architecture with random
    weights (seed RANDOM_WEIGHTS_SEED) built directly on `device` in `dtype` (a 27B preset in bf16 never
    exists in fp32 or on the host), and the embedded tokenizer (built from the corpus once, cached), whose
    ids all fall inside the preset's vocabulary. For costs and code paths at a model's shape: its text is
    noise, so its tau means nothing. The LM head's rows past the tokenizer's vocabulary are zero: the head
    keeps the preset's shape and cost, and greedy text (a random row's logits are positive somewhere)
    stays inside the tokenizer, so regenerated answers decode to text as long as they were generated.
    The global RNG is left as it was."""
    tok_dir = ensure_tokenizer(cfg, progress=progress)
    ids = json.loads((tok_dir / "special_tokens.json").read_text())
    words = int(ids["vocab_size"])
    vocab = max(int(PRESETS[preset]["vocab_size"]), words)
    arch = {"vocab_size": vocab, "eos_token_id": int(ids["eos_token_id"]), "pad_token_id": int(ids["pad_token_id"])}
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(RANDOM_WEIGHTS_SEED)
        target = load_target(preset, device=device, dtype=dtype, overrides=arch)
    with torch.no_grad():
        target.lm_head.weight[words:].zero_()
    return target, load_tokenizer(tok_dir)
