"""Load and save the target in Hugging Face format (config.json + safetensors, single or sharded)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ready.artifacts import ArtifactError, atomic_dir, check_folder
from ready.checkpoint_files import (check_fits, check_floating, check_layers, layer_count, read_json, tensor_headers,
                                     weight_files)
from ready.health import check_model
from ready.target.config import PRESETS, HybridConfig, TargetError, preset_config
from ready.target.model import HybridLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Prefixes of multimodal Qwen3.5 checkpoints (`qwen3_5` with a text_config) -> ours.
_PREFIX_MAP = (("model.language_model.", "model."),)
_IGNORED = ("mtp.", "model.visual.", "visual.")


def _dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise TargetError(f"unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _device(device: Any) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TargetError(f"device {device!r} requested but CUDA is not available on this machine; use 'cpu'")
    return dev


def _our_name(key: str) -> Optional[str]:
    """A checkpoint tensor's name in HybridLM (multimodal prefixes mapped), None for the parts this tool ignores."""
    for src, dst in _PREFIX_MAP:
        if key.startswith(src):
            key = dst + key[len(src):]
    return None if key.startswith(_IGNORED) else key


def _load_file(f: Path, expected: dict[str, torch.Tensor], dt: torch.dtype, loaded: dict[str, torch.Tensor]) -> None:
    """Add the tensors of one safetensors file that the model expects to `loaded` (cast to `dt`); their
    headers were checked before (`load_target`). A file that breaks mid-read is one TargetError naming it."""
    try:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for key in sf.keys():
                ours = _our_name(key)
                if ours is not None and ours in expected:
                    loaded[ours] = sf.get_tensor(key).to(dt)
    except Exception as e:  # SafetensorError (truncated, bad header), OSError (missing, unreadable)
        raise TargetError(f"{f}: not a readable safetensors file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          "expected the checkpoint's weights as written") from None


def load_target(
    path_or_preset: str | os.PathLike,
    device: Any = "cpu",
    dtype: Any = torch.float32,
    overrides: Optional[dict[str, Any]] = None,
) -> HybridLM:
    """A preset name gives a randomly initialised model (`overrides` adjusts its sizes); a
    directory gives the checkpoint's weights, loaded by Hugging Face parameter name."""
    dev, dt = _device(device), _dtype(dtype)
    name = str(path_or_preset)
    if name in PRESETS:
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dt)  # build in the target dtype: a 27B model has no room for an fp32 copy
        try:
            with torch.device(dev):
                model = HybridLM(preset_config(name, overrides))
        finally:
            torch.set_default_dtype(prev)
        return model.eval()
    path = Path(name)
    if not path.is_dir():
        raise TargetError(
            f"target {name!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor an existing checkpoint directory"
        )
    try:
        check_folder(path, "target checkpoint", patterns=("*.safetensors",))  # weights; JSON is parsed below
    except ArtifactError as e:
        raise TargetError(str(e)) from None
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise TargetError(f"{path}: no config.json; expected a Hugging Face checkpoint directory")
    source = str(cfg_file)
    fields = HybridConfig.hf_fields(read_json(cfg_file, "a Hugging Face model config", TargetError), source=source)
    headers = tensor_headers(weight_files(path, TargetError, any_safetensors=True), TargetError, rename=_our_name)
    # sizes before anything is built: a hand-edited num_hidden_layers of 100,000 built for minutes
    check_layers(fields["num_hidden_layers"], layer_count(headers, "model.layers."), "num_hidden_layers", source,
                 TargetError)
    try:
        cfg = HybridConfig(**fields)
    except TargetError as e:
        raise TargetError(f"{source}: {e}") from None
    with torch.device("meta"):
        model = HybridLM(cfg)
    expected = model.state_dict()
    used = {name: h for name, h in headers.items() if name in expected}
    for name, h in used.items():
        if h.shape != tuple(expected[name].shape):
            raise TargetError(f"{h.file.name}: tensor {h.key} has shape {h.shape}, expected "
                              f"{tuple(expected[name].shape)} for this config")
    check_floating(used, TargetError)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    nbytes = sum(t.numel() for name, t in expected.items() if name not in tied) * dt.itemsize
    check_fits(nbytes, dev, f"{source}: num_hidden_layers {cfg.num_hidden_layers}, hidden_size {cfg.hidden_size}, "
               f"intermediate_size {cfg.intermediate_size}, vocab_size {cfg.vocab_size} in {str(dt).removeprefix('torch.')}",
               TargetError)
    loaded: dict[str, torch.Tensor] = {}
    for f in sorted({h.file for h in used.values()}):
        _load_file(f, expected, dt, loaded)
    if cfg.tie_word_embeddings and "lm_head.weight" not in loaded and "model.embed_tokens.weight" in loaded:
        loaded["lm_head.weight"] = loaded["model.embed_tokens.weight"]
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise TargetError(f"{path}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    model.load_state_dict(loaded, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(dev).eval()
    check_model(model, f"target {path}")  # NaN/Inf weights would still "decode": every entry point refuses them
    return model


def save_target(model: HybridLM, out_dir: str | os.PathLike, tokenizer: Any = None,
                shard_bytes: Optional[int] = None) -> Path:
    """Write config.json + model.safetensors atomically (loadable by transformers' Qwen3_5ForCausalLM).

    `shard_bytes`: write shards of at most that many bytes (a tensor larger than it gets a shard of its own),
    `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`, as Hugging Face shards a large
    checkpoint; each shard's tensors are copied to the host only while it is written, so a 54 GB model on
    the GPU needs one shard of host memory."""
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        cfg = model.config.to_hf_dict()
        cfg["torch_dtype"] = str(model.dtype).replace("torch.", "")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        state = dict(model.state_dict())
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        if shard_bytes is None:
            save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})
        else:
            _save_shards(state, tmp, int(shard_bytes))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return out


def _save_shards(state: dict[str, torch.Tensor], folder: Path, shard_bytes: int) -> None:
    """`state` as Hugging Face shards of at most `shard_bytes` bytes each, with their index."""
    if shard_bytes < 1:
        raise TargetError(f"shard_bytes={shard_bytes}; expected a positive number of bytes per shard")
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in state.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map, total = {}, 0
    for i, names in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        part = {k: state[k].detach().contiguous().cpu() for k in names}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in part.values())
        weight_map.update({k: file for k in names})
        del part
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
