"""Drafter checkpoints in the DSpark format (the public checkpoints', SpecForge's and DeepSpec's).

A drafter folder is a Hugging Face DSpark folder:

    config.json                 Qwen3-style drafter config with `dflash_config` (projector_type dspark,
                                mask_token_id, target_layer_ids, markov_head_type/_rank, confidence head)
    model.safetensors           the drafter's weights in DSpark's names (or shards + model.safetensors.index.json)

so SpecForge's `DSparkDraftModel.from_pretrained(folder)` loads what this tool saves. A drafter without
a Markov head (`drafter.head: none`) is a DFlash drafter: its folder is DFlash's (architectures
DFlashDraftModel, `dflash_config` = mask_token_id + target_layer_ids, as SpecForge and z-lab write it),
which SpecForge's `DFlashDraftModel.from_pretrained(folder)` loads; with a confidence head it is a DSpark
folder with `markov_rank` 0 (SpecForge's DSparkDraftModel without a Markov head). Folders this
tool writes carry two more things that a DSpark-only loader ignores: a `ready_drafter` block in
config.json (the drafter config as specified, with paper-space layer ids, and a fingerprint of the
target it was built for) and, for a ReaDy drafter, the reader (`ready_reader` block and
`ready_reader.safetensors`). Folders from elsewhere load too: everything their config says is
honoured or refused in one line (`DrafterError`), including the legacy `logit_head.*` key names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from ready.artifacts import ArtifactError, atomic_dir, check_folder, file_digest
from ready.config import DrafterConfig, ReaderConfig
from ready.drafter.heads import MARKOV_TYPES
from ready.drafter.layers import rope_type
from ready.drafter.model import DSparkDrafter, DrafterError, fingerprint_mismatch, target_fingerprint

FORMAT = "ready-dspark-drafter/2"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
READER_FILE = "ready_reader.safetensors"
OWN_FILES = {CONFIG_FILE, WEIGHTS_FILE, READER_FILE, "DONE"}
# key prefixes of early DSpark checkpoints (heads nested under `logit_head`), as SpecForge maps them
LEGACY_PREFIXES = (("logit_head.markov_head.", "markov_head."), ("logit_head.confidence_head.", "confidence_head."))


# --- writing ------------------------------------------------------------------------------------

def dspark_config(drafter: DSparkDrafter) -> dict:
    """The Hugging Face DSpark config.json of `drafter` (without this tool's own blocks); DFlash's for a
    drafter without a Markov head and without a confidence head."""
    d = drafter.drafter_cfg
    attn = drafter.layers[0].self_attn
    scaling = dict(d.get("rope_scaling") or {})
    head = drafter.markov_head
    dtype = str(drafter.fc.weight.dtype).removeprefix("torch.")
    if drafter.is_dflash and drafter.confidence_head is None:  # DFlash: its model reads these two only
        dflash = {"mask_token_id": drafter.mask_token_id, "target_layer_ids": list(drafter.capture_layers)}
    else:
        dflash = {
            "projector_type": "dspark",
            "attention_mode": "gqa" if attn.num_kv_heads < attn.num_heads else "mha",
            "mask_token_id": drafter.mask_token_id,
            "target_layer_ids": list(drafter.capture_layers),
            **({"markov_head_type": str(d["head"])} if head.rank else {}),
            "markov_rank": head.rank,
            "enable_confidence_head": drafter.confidence_head is not None,
            "confidence_head_with_markov": bool(drafter.confidence_head is not None
                                                and drafter.confidence_head.with_markov),
        }
    return {
        "architectures": ["DFlashDraftModel" if "projector_type" not in dflash else "DSparkDraftModel"],
        "model_type": "qwen3",
        "hidden_size": drafter.hidden_size,
        "num_hidden_layers": drafter.num_layers,
        "num_attention_heads": attn.num_heads,
        "num_key_value_heads": attn.num_kv_heads,
        "head_dim": drafter.head_dim,
        "intermediate_size": drafter.layers[0].mlp.gate_proj.out_features,
        "hidden_act": "silu",
        "rms_norm_eps": float(d["rms_norm_eps"]),
        "rope_theta": float(d["rope_theta"]),
        "rope_scaling": scaling or None,
        "max_position_embeddings": drafter.max_position_embeddings,
        "vocab_size": drafter.vocab_size,
        "num_target_layers": drafter.target_num_layers,
        "block_size": drafter.block_size,
        "layer_types": ["full_attention"] * drafter.num_layers,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "dtype": dtype,
        "dflash_config": dflash,
    }


def save_drafter(drafter: DSparkDrafter, path: str | Path) -> Path:
    """Write `drafter` as a DSpark folder at `path` (atomically, as a whole); the reader, if any, beside it."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists():
        extra = sorted(p.name for p in path.iterdir() if p.name not in OWN_FILES)
        if extra:
            raise DrafterError(f"{path}: not a drafter folder (holds {extra[:5]}); saving replaces the whole folder, "
                               "so expected a new or drafter-only folder")
    state = drafter.state_dict()
    if any("lora_" in k or ".base_layer." in k for k in state):
        raise DrafterError("this drafter still carries LoRA adapters; merge them first (peft merge_and_unload) "
                           "so the checkpoint holds plain drafter weights")
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    reader = {k: v for k, v in tensors.items() if k.startswith("readers.")}
    weights = {k: v for k, v in tensors.items() if not k.startswith("readers.")}
    config = dspark_config(drafter)
    config["ready_drafter"] = {"format": FORMAT, "drafter": drafter.drafter_cfg, "resolved": drafter.resolved(),
                               "target": drafter._fingerprint}
    if drafter.reader_enabled:
        config["ready_reader"] = {"config": drafter.reader_cfg, "weights": READER_FILE}
    with atomic_dir(path) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if reader:
            save_file(reader, str(tmp / READER_FILE), metadata={"format": "pt"})
    return path


# --- reading ------------------------------------------------------------------------------------

def _refuse(path: Path, what: str) -> DrafterError:
    return DrafterError(f"{path / CONFIG_FILE}: {what}")


def _rope(raw: dict, path: Path) -> tuple[float, dict]:
    """(rope_theta, rope_scaling) from either the rope_scaling or the newer rope_parameters form."""
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    if float(rope.pop("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(path, "partial_rotary_factor != 1; expected a drafter that rotates whole heads (DSpark's)")
    return theta, (rope if rope_type(rope) != "default" else {})


def drafter_config_from_dspark(raw: dict, target: Any, path: Path) -> dict:
    """The DrafterConfig fields a DSpark config.json describes, checked against `target`; one
    DrafterError naming the field for anything this tool cannot honour."""
    c = target.config
    dc = raw.get("dflash_config")
    if not isinstance(dc, dict):
        raise _refuse(path, "no 'dflash_config' block; expected a DSpark drafter config (SpecForge / DeepSpec format)")
    projector = dc.get("projector_type")
    if projector not in (None, "dspark", "dflash"):
        raise _refuse(path, f"dflash_config.projector_type is {projector!r}; expected 'dspark' (DSpark) or 'dflash' / "
                            "none (DFlash)")
    bad_types = sorted(set(raw.get("layer_types") or []) - {"full_attention"})
    if bad_types or raw.get("use_sliding_window"):
        raise _refuse(path, f"layer_types has {bad_types or ['sliding window']}; expected only full_attention layers "
                            "(sliding-window draft layers are not supported)")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("tie_word_embeddings", False)):
        if raw.get(key, want) != want:
            raise _refuse(path, f"{key} is {raw.get(key)!r}; expected {want!r}")
    for key, want in (("hidden_size", int(c.hidden_size)), ("vocab_size", int(c.vocab_size))):
        if int(raw.get(key, -1)) != want:
            raise _refuse(path, f"{key} is {raw.get(key)!r} but the target has {want}; expected a drafter built "
                                "for this target")
    n_target = raw.get("num_target_layers")
    if n_target is not None and int(n_target) != int(c.num_hidden_layers):
        raise _refuse(path, f"num_target_layers is {n_target} but the target has {c.num_hidden_layers} layers; "
                            "expected a drafter built for this target")
    layer_ids = dc.get("target_layer_ids")
    if (not layer_ids or any(not -1 <= int(i) < int(c.num_hidden_layers) for i in layer_ids)
            or list(layer_ids) != sorted(set(layer_ids))):
        raise _refuse(path, f"dflash_config.target_layer_ids = {layer_ids}; expected ascending target layer ids in "
                            f"0..{int(c.num_hidden_layers) - 1}")
    # markov_rank 0 (or none: DFlash's config) = no Markov head, as SpecForge builds it: a DFlash drafter
    rank = int(dc.get("markov_rank", 0) or 0)
    kind = str(dc.get("markov_head_type", "vanilla")).lower() if rank else "none"
    if rank < 0 or (rank and kind not in MARKOV_TYPES):
        raise _refuse(path, f"dflash_config.markov_head_type {kind!r} with markov_rank {rank}; expected one of "
                            f"{list(MARKOV_TYPES)} with rank >= 1, or markov_rank 0 (DFlash: no Markov head)")
    if rank and "DFlashDraftModel" in (raw.get("architectures") or []):
        raise _refuse(path, f"architectures DFlashDraftModel with dflash_config.markov_rank {rank}; a DFlash model "
                            "builds no Markov head, so expected markov_rank 0 (or DSparkDraftModel)")
    mask = dc.get("mask_token_id")
    if mask is None or not 0 <= int(mask) < int(c.vocab_size):
        raise _refuse(path, f"dflash_config.mask_token_id is {mask!r}; expected a token id of the target "
                            f"(0..{int(c.vocab_size) - 1})")
    heads = int(raw["num_attention_heads"])
    theta, scaling = _rope(raw, path)
    confidence = bool(dc.get("enable_confidence_head", float(dc.get("confidence_head_alpha", 0.0) or 0.0) > 0.0))
    if confidence and not rank and dc.get("confidence_head_with_markov"):
        raise _refuse(path, "dflash_config.confidence_head_with_markov is true with markov_rank 0; expected false "
                            "(without a Markov head the confidence head reads the hidden states only)")
    return {
        "block_size": int(raw["block_size"]),
        "num_layers": int(raw["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(raw.get("num_key_value_heads", heads)),
        "head_dim": int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
        "intermediate_size": int(raw["intermediate_size"]),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "mask_token_id": int(mask),
        "context_layers": [int(i) for i in layer_ids],
        "layer_space": "model",
        "head": kind,
        "head_rank": rank,  # 0 with head none (not used)
        "confidence_head": confidence,
        "confidence_with_markov": bool(dc.get("confidence_head_with_markov", False)),
        "checkpoint": None,
        "context_window": 0,
    }


def read_json(file: Path) -> dict:
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DrafterError(f"{file}: not readable JSON ({str(e).splitlines()[0]}); expected a DSpark drafter config") from None
    if not isinstance(raw, dict):
        raise DrafterError(f"{file}: holds a {type(raw).__name__}; expected a DSpark drafter config (a JSON object)")
    return raw


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """One safetensors file, or one DrafterError naming it (unreadable, truncated, NaN/Inf)."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(file))
    except Exception as e:  # SafetensorError (truncated, bad header), OSError
        raise DrafterError(f"{file}: not a readable safetensors file ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); expected drafter weights") from None
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise DrafterError(f"{file}: tensor {name} holds NaN or Inf values; expected finite weights")
    return state


def weight_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names."""
    if (path / INDEX_FILE).is_file():
        index = read_json(path / INDEX_FILE)
        shards = sorted(set((index.get("weight_map") or {}).values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if not shards or missing:
            raise DrafterError(f"{path / INDEX_FILE}: names shards {missing or shards}; expected every shard beside it")
        return [path / s for s in shards]
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    raise DrafterError(f"{path}: no {WEIGHTS_FILE} (or {INDEX_FILE} with shards); expected the drafter's weights")


def _normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in state.items():
        for old, new in LEGACY_PREFIXES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


def load_drafter(path: str | Path, target: Any, reader_cfg: ReaderConfig | DictConfig | None = None) -> DSparkDrafter:
    """The drafter in the DSpark folder `path`, attached to `target`.

    With `reader_cfg` the backbone is loaded under that reader configuration and the readers start
    fresh (stage 1 of ReaDy on a DSpark checkpoint); without it, a reader saved beside the drafter is
    loaded with it. A folder this tool wrote must have been built for this very target, and its files
    must match the manifest it was written with.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise DrafterError(f"{path}: no drafter checkpoint here; expected a DSpark folder ({CONFIG_FILE} with "
                           f"dflash_config + {WEIGHTS_FILE}) as this tool, SpecForge or DeepSpec save it")
    try:
        check_folder(path, "drafter checkpoint", patterns=("*.safetensors",))  # a manifest only in folders we wrote
    except ArtifactError as e:
        raise DrafterError(str(e)) from None
    raw = read_json(path / CONFIG_FILE)
    drafter_fields = drafter_config_from_dspark(raw, target, path)
    own = raw.get("ready_drafter")
    saved_reader: Any = {"enabled": False}
    if isinstance(own, dict):
        if own.get("format") != FORMAT:
            raise _refuse(path, f"ready_drafter.format is {own.get('format')!r}; expected {FORMAT!r}")
        why = fingerprint_mismatch(own["target"], target_fingerprint(target))
        if why:
            raise DrafterError(f"{path}: this drafter was built for another target: {why}")
        drafter_fields = own["drafter"]
        if isinstance(raw.get("ready_reader"), dict):
            saved_reader = raw["ready_reader"]["config"]
    try:
        dcfg = OmegaConf.merge(OmegaConf.structured(DrafterConfig), drafter_fields)
        rcfg = OmegaConf.merge(OmegaConf.structured(ReaderConfig), reader_cfg if reader_cfg is not None else saved_reader)
    except Exception as e:  # omegaconf raises several types; all mean the schema moved on
        raise DrafterError(f"{path}: its drafter/reader config does not fit the current schema: "
                           f"{str(e).splitlines()[0]}") from None
    drafter = DSparkDrafter(dcfg, rcfg, target)
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        state.update(_normalise_keys(load_tensors(file)))
    if drafter.reader_enabled:
        if reader_cfg is None:
            if not (path / READER_FILE).is_file():
                raise DrafterError(f"{path}: config.json declares a reader but {READER_FILE} is missing; expected "
                                   "the reader's weights beside the drafter")
            state.update(load_tensors(path / READER_FILE))
        else:
            state.update({k: v for k, v in drafter.state_dict().items() if k.startswith("readers.")})
    try:
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape
        raise DrafterError(f"{path}: weights do not fit its config.json: {str(e).splitlines()[-1].strip()}") from None
    if missing or unexpected:
        raise DrafterError(f"{path}: weights do not match its config.json (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]}); a LoRA-wrapped drafter must be merged before saving")
    return drafter.to(target.embed_tokens.weight.device)


def is_drafter_folder(path: str | Path) -> bool:
    """Whether `path` looks like a drafter folder (a config.json with a dflash_config)."""
    file = Path(path) / CONFIG_FILE
    try:
        return isinstance(json.loads(file.read_text()).get("dflash_config"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def has_markov_head(path: str | Path) -> bool:
    """Whether the drafter folder at `path` has a Markov head (False: a DFlash drafter), from its config.json
    alone (this tool's `ready_drafter` block when present, else `dflash_config.markov_rank`)."""
    raw = read_json(Path(path) / CONFIG_FILE)
    own = raw.get("ready_drafter")
    if isinstance(own, dict) and isinstance(own.get("drafter"), dict):
        return own["drafter"].get("head", "vanilla") != "none"
    return int((raw.get("dflash_config") or {}).get("markov_rank", 0) or 0) > 0


def content_digest(path: str | Path) -> str:
    """sha256 over a drafter folder's config and weights (names and contents): what a sweep row that
    starts from it depends on, the same on every host (each file is hashed once per process)."""
    import hashlib

    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise DrafterError(f"{path}: no {CONFIG_FILE}; expected a DSpark drafter folder")
    h = hashlib.sha256()
    for p in sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json")):
        h.update(f"{p.name}:{file_digest(p)}\n".encode())
    return h.hexdigest()[:16]
