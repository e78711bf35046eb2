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

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, TypeVar

import torch
from omegaconf import DictConfig

from ready import checkpoint_files
from ready.artifacts import ArtifactError, atomic_dir, check_folder, file_digest
from ready.checkpoint_files import Fields
from ready.config import ConfigError, DrafterConfig, ReaderConfig, renamed_keys, section
from ready.drafter.heads import MARKOV_TYPES
from ready.drafter.layers import rope_type
from ready.drafter.layer_map import LayerMapError
from ready.drafter.model import DSparkDrafter, DrafterError, fingerprint_mismatch, target_fingerprint

FORMAT = "ready-dspark-drafter/2"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
READER_FILE = "ready_reader.safetensors"
OWN_FILES = {CONFIG_FILE, WEIGHTS_FILE, READER_FILE, "DONE"}
SectionT = TypeVar("SectionT")
# key prefixes of early DSpark checkpoints (heads nested under `logit_head`), as SpecForge maps them
LEGACY_PREFIXES = (("logit_head.markov_head.", "markov_head."), ("logit_head.confidence_head.", "confidence_head."))


# --- writing ------------------------------------------------------------------------------------

def dspark_config(drafter: DSparkDrafter) -> dict:
    """The Hugging Face DSpark config.json of `drafter` (without this tool's own blocks); DFlash's for a
    drafter without a Markov head and without a confidence head."""
    d = drafter.drafter_cfg
    attn = drafter.layers[0].self_attn
    scaling = dict(d.rope_scaling)
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
            **({"markov_head_type": d.head} if head.rank else {}),
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
        "rms_norm_eps": d.rms_norm_eps,
        "rope_theta": d.rope_theta,
        "rope_scaling": scaling or None,
        "max_position_embeddings": drafter.max_position_embeddings,
        "vocab_size": drafter.vocab_size,
        "num_target_layers": drafter.target_num_layers,
        "block_size": drafter.proposals + 1,  # DSpark's block counts the anchor
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
    config["ready_drafter"] = {"format": FORMAT, "drafter": dataclasses.asdict(drafter.drafter_cfg),
                               "resolved": drafter.resolved(), "target": drafter._fingerprint}
    if drafter.reader_enabled:
        config["ready_reader"] = {"config": dataclasses.asdict(drafter.reader_cfg), "weights": READER_FILE}
    with atomic_dir(path) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if reader:
            save_file(reader, str(tmp / READER_FILE), metadata={"format": "pt"})
    return path


# --- reading ------------------------------------------------------------------------------------

def _refuse(path: Path, what: str) -> DrafterError:
    return DrafterError(f"{path / CONFIG_FILE}: {what}")


def _rope(f: Fields, path: Path) -> tuple[float, dict]:
    """(rope_theta, rope_scaling) from either the rope_scaling or the newer rope_parameters form, typed."""
    key = "rope_parameters" if f.raw.get("rope_parameters") else "rope_scaling"
    rope = dict(f.block(key, None) or {})
    fields = Fields(rope, f.source, DrafterError, prefix=f"{key}.")
    theta = fields.number("rope_theta", None, above=0.0)
    theta = f.number("rope_theta", 10000.0, above=0.0) if theta is None else theta
    rope.pop("rope_theta", None)
    if fields.number("partial_rotary_factor", 1.0, above=0.0, high=1.0) != 1.0:
        raise _refuse(path, "partial_rotary_factor != 1; expected a drafter that rotates whole heads (DSpark's)")
    rope.pop("partial_rotary_factor", None)
    for name in ("rope_type", "type"):
        fields.text(name, None)
    if rope_type(rope) == "default":
        return theta, {}
    fields.number("factor", None, above=0.0)
    fields.integer("original_max_position_embeddings", None, low=1)
    return theta, rope


def drafter_config_from_dspark(raw: dict, target: Any, path: Path) -> DrafterConfig:
    """The DrafterConfig a DSpark config.json describes (what it does not describe at the dataclass's defaults),
    checked against `target`; one
    DrafterError naming the field for anything this tool cannot honour (a missing, mistyped or
    out-of-range field included: `hidden_size: "abc"`, `num_attention_heads: 0`, `target_layer_ids: 5`)."""
    c = target.config
    f = Fields(raw, str(path / CONFIG_FILE), DrafterError)
    if not isinstance(raw.get("dflash_config"), dict):
        raise _refuse(path, "no 'dflash_config' block; expected a DSpark drafter config (SpecForge / DeepSpec format)")
    dc = f.sub("dflash_config")
    projector = dc.raw.get("projector_type")
    if projector not in (None, "dspark", "dflash"):
        raise _refuse(path, f"dflash_config.projector_type is {projector!r}; expected 'dspark' (DSpark) or 'dflash' / "
                            "none (DFlash)")
    bad_types = sorted(set(f.texts("layer_types", [])) - {"full_attention"})
    if bad_types or f.flag("use_sliding_window", False):
        raise _refuse(path, f"layer_types has {bad_types or ['sliding window']}; expected only full_attention layers "
                            "(sliding-window draft layers are not supported)")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("tie_word_embeddings", False)):
        if raw.get(key, want) != want:
            raise _refuse(path, f"{key} is {raw.get(key)!r}; expected {want!r}")
    for key, want in (("hidden_size", int(c.hidden_size)), ("vocab_size", int(c.vocab_size))):
        if f.integer(key, low=1) != want:
            raise _refuse(path, f"{key} is {raw.get(key)!r} but the target has {want}; expected a drafter built "
                                "for this target")
    n_target = f.integer("num_target_layers", None, low=1)
    if n_target is not None and n_target != int(c.num_hidden_layers):
        raise _refuse(path, f"num_target_layers is {n_target} but the target has {c.num_hidden_layers} layers; "
                            "expected a drafter built for this target")
    layer_ids = dc.raw.get("target_layer_ids")
    if (not isinstance(layer_ids, list) or not layer_ids
            or any(isinstance(i, bool) or not isinstance(i, int) or not -1 <= i < int(c.num_hidden_layers)
                   for i in layer_ids)
            or layer_ids != sorted(set(layer_ids))):
        raise _refuse(path, f"dflash_config.target_layer_ids = {layer_ids}; expected ascending target layer ids in "
                            f"0..{int(c.num_hidden_layers) - 1}")
    # markov_rank 0 (or none: DFlash's config) = no Markov head, as SpecForge builds it: a DFlash drafter
    rank = dc.integer("markov_rank", 0)
    kind = str(dc.text("markov_head_type", "vanilla")).lower() if rank else "none"
    if rank < 0 or (rank and kind not in MARKOV_TYPES):
        raise _refuse(path, f"dflash_config.markov_head_type {kind!r} with markov_rank {rank}; expected one of "
                            f"{list(MARKOV_TYPES)} with rank >= 1, or markov_rank 0 (DFlash: no Markov head)")
    if rank and "DFlashDraftModel" in f.texts("architectures", []):
        raise _refuse(path, f"architectures DFlashDraftModel with dflash_config.markov_rank {rank}; a DFlash model "
                            "builds no Markov head, so expected markov_rank 0 (or DSparkDraftModel)")
    vocab = int(c.vocab_size)
    mask = dc.raw.get("mask_token_id")
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < vocab:
        raise _refuse(path, f"dflash_config.mask_token_id is {mask!r}; expected a token id of the target "
                            f"(0..{vocab - 1})")
    heads = f.integer("num_attention_heads", low=1)
    kv_heads = f.integer("num_key_value_heads", heads, low=1)
    if heads % kv_heads:
        raise _refuse(path, f"num_attention_heads is {heads}, not a multiple of num_key_value_heads {kv_heads}; "
                            "expected whole query groups")
    head_dim = f.integer("head_dim", None, low=2)
    if head_dim is None:
        head_dim = int(c.hidden_size) // heads
    if head_dim < 2 or head_dim % 2:
        raise _refuse(path, f"head_dim is {head_dim}{'' if 'head_dim' in raw else ' (hidden_size // num_attention_heads)'}; "
                            "expected an even integer >= 2 (the rotary turns pairs)")
    theta, scaling = _rope(f, path)
    alpha = dc.number("confidence_head_alpha", 0.0, low=0.0)
    confidence = dc.flag("enable_confidence_head", alpha > 0.0)
    with_markov = dc.flag("confidence_head_with_markov", False)
    if confidence and not rank and with_markov:
        raise _refuse(path, "dflash_config.confidence_head_with_markov is true with markov_rank 0; expected false "
                            "(without a Markov head the confidence head reads the hidden states only)")
    return DrafterConfig(  # each field typed and ranged above; checkpoint and context_window at their defaults
        proposals=f.integer("block_size", low=2) - 1,  # DSpark's block counts the anchor
        num_layers=f.integer("num_hidden_layers", low=1),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=f.integer("intermediate_size", low=1),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6, above=0.0),  # the format's (Qwen3's) default
        mask_token_id=mask,
        context_layers=list(layer_ids),
        layer_space="model",
        head=kind,
        head_rank=rank,  # 0 with head none (not used)
        confidence_head=confidence,
        confidence_with_markov=with_markov,
    )


def own_blocks(raw: dict, path: Path) -> tuple[Optional[dict], Optional[dict]]:
    """(ready_drafter, ready_reader): this tool's blocks of a config.json, each None when absent; a block of
    the wrong shape (a list, no `drafter` object) is one DrafterError naming it."""
    f = Fields(raw, str(path / CONFIG_FILE), DrafterError)
    own = f.block("ready_drafter", None)
    if own is None:
        return None, None
    mine = f.sub("ready_drafter")
    if own.get("format") != FORMAT:
        raise _refuse(path, f"ready_drafter.format is {own.get('format')!r}; expected {FORMAT!r}")
    mine.block("drafter")
    fingerprint = mine.sub("target")
    fingerprint.block("arch")
    for name in ("embed_tokens", "lm_head"):
        value = fingerprint.raw.get(name)
        if not (isinstance(value, list) and value and all(
                isinstance(row, list) and row and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                      for x in row) for row in value)):
            raise fingerprint.refuse(name, value, "the rows of numbers this tool writes (a target fingerprint)")
    reader = f.block("ready_reader", None)
    if reader is not None:
        f.sub("ready_reader").block("config")
    return own, reader


def typed(kind: type[SectionT], value: Any, path: Path, key: str) -> SectionT:
    """`ready.config.section` for a block of a drafter folder's config.json: an unknown key or a mistyped value
    is one DrafterError naming the file and the key's full path."""
    try:
        return section(kind, value, str(path / CONFIG_FILE), key)
    except ConfigError as e:
        raise DrafterError(str(e)) from None


def saved_drafter_config(own: dict, path: Path) -> DrafterConfig:
    """The drafter config this tool saved in a folder's `ready_drafter` block (`own_blocks`) as a DrafterConfig:
    a folder written before drafter.block_size was renamed proposals holds the old key (read as proposals =
    block_size - 1); keys a folder predates take today's defaults; a key the schema does not have (a misspelling,
    a key from a newer tool) is one DrafterError naming it."""
    try:
        fields = renamed_keys(own["drafter"], f"{path / CONFIG_FILE}: ready_drafter", "drafter", quiet=True)
    except ConfigError as e:
        raise DrafterError(str(e)) from None
    return typed(DrafterConfig, fields, path, "ready_drafter.drafter")


def read_json(file: Path) -> dict:
    """A drafter folder's JSON file (its config.json, its index) as an object, or one DrafterError naming it."""
    return checkpoint_files.read_json(file, "a DSpark drafter config", DrafterError)


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """One safetensors file, or one DrafterError naming it (unreadable, truncated, NaN/Inf)."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(file))
    except Exception as e:  # SafetensorError (truncated, bad header), OSError
        raise DrafterError(f"{file}: not a readable safetensors file ({type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}); expected drafter weights") from None
    checkpoint_files.check_finite(state, file, DrafterError)
    return state


def weight_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names (each a file inside the folder)."""
    return checkpoint_files.weight_files(path, DrafterError, single=WEIGHTS_FILE, index=INDEX_FILE)


def _our_name(key: str) -> str:
    """A tensor's name in DSparkDrafter: early checkpoints' `logit_head.` prefixes mapped."""
    for old, new in LEGACY_PREFIXES:
        if key.startswith(old):
            return new + key[len(old):]
    return key


def read_weights(files: list[Path], rename: Callable[[str], str] = _our_name) -> dict[str, torch.Tensor]:
    """The tensors of a drafter's weight files under `rename`d names, checked before any is read (floating
    dtypes, each tensor in one file only) and as read (finite)."""
    checkpoint_files.check_floating(checkpoint_files.tensor_headers(files, DrafterError, rename), DrafterError)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update({rename(k): v for k, v in load_tensors(file).items()})
    return state


def _build(dcfg: DrafterConfig, rcfg: ReaderConfig, target: Any, path: Path) -> DSparkDrafter:
    """DSparkDrafter(dcfg, rcfg, target), its refusals (a field out of range) prefixed with the folder."""
    try:
        return DSparkDrafter(dcfg, rcfg, target)
    except (DrafterError, LayerMapError) as e:
        raise DrafterError(f"{path}: {e}") from None


def _fit_before_building(dcfg: DrafterConfig, rcfg: ReaderConfig, target: Any, files: list[Path], field: str,
                         source: str) -> None:
    """The drafter `dcfg` describes against its weight files' headers, before a parameter is allocated:
    no more layers than the files hold (200,000 declared layers built for minutes), every shape as in
    the files, and parameters that fit in memory."""
    headers = checkpoint_files.tensor_headers(files, DrafterError, _our_name)
    checkpoint_files.check_layers(dcfg.num_layers, checkpoint_files.layer_count(headers, "layers."), field,
                                  source, DrafterError)
    plain = dataclasses.replace(dcfg, rope_scaling={})  # the rotary holds no parameter (scaled kinds: host-computed)
    with torch.device("meta"):
        shape = _build(plain, rcfg, target, Path(source).parent)
    expected = shape.state_dict()
    for name, h in headers.items():
        if name in expected and h.shape != tuple(expected[name].shape):
            raise DrafterError(f"{Path(source).parent}: weights do not fit its config.json: tensor {h.key} of "
                               f"{h.file.name} has shape {list(h.shape)}, the config makes {list(expected[name].shape)}")
    nbytes = sum(t.numel() * t.element_size() for t in expected.values())
    checkpoint_files.check_fits(nbytes, target.embed_tokens.weight.device,
                                f"{source}: {field} {dcfg.num_layers}, intermediate_size "
                                f"{dcfg.intermediate_size}, num_attention_heads {dcfg.num_attention_heads} x "
                                f"head_dim {dcfg.head_dim}", DrafterError)


def load_drafter(path: str | Path, target: Any,
                 reader_cfg: ReaderConfig | DictConfig | Mapping[str, Any] | None = None) -> DSparkDrafter:
    """The drafter in the DSpark folder `path`, attached to `target`.

    With `reader_cfg` the backbone is loaded under that reader configuration and the readers start
    fresh (stage 1 of ReaDy on a DSpark checkpoint); without it, a reader saved beside the drafter is
    loaded with it. A folder this tool wrote must have been built for this very target, and its files
    must match the manifest it was written with. Every field read is typed and ranged, and the sizes
    are checked against the weight files before anything is allocated.
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
    dcfg = drafter_config_from_dspark(raw, target, path)
    own, own_reader = own_blocks(raw, path)
    layers_field = "num_hidden_layers"
    if own is not None:
        try:
            why = fingerprint_mismatch(own["target"], target_fingerprint(target))
        except (RuntimeError, ValueError) as e:  # rows of unequal length, a fingerprint of another shape
            raise _refuse(path, f"ready_drafter.target is not a target fingerprint this tool wrote ({e}); expected "
                                "the block as saved") from None
        if why:
            raise DrafterError(f"{path}: this drafter was built for another target: {why}")
        dcfg = saved_drafter_config(own, path)
        layers_field = "ready_drafter.drafter.num_layers"
    if reader_cfg is not None:
        try:
            rcfg = section(ReaderConfig, reader_cfg, "load_drafter", "reader_cfg")
        except ConfigError as e:
            raise DrafterError(str(e)) from None
    elif own_reader is not None:
        rcfg = typed(ReaderConfig, own_reader["config"], path, "ready_reader.config")
    else:
        rcfg = ReaderConfig(enabled=False)  # no reader saved (a DSpark folder from elsewhere has none)
    files = weight_files(path)
    if rcfg.enabled and reader_cfg is None:
        if not (path / READER_FILE).exists():
            raise DrafterError(f"{path}: config.json declares a reader but {READER_FILE} is missing; expected "
                               "the reader's weights beside the drafter")
        files.append(checkpoint_files.inside(path, READER_FILE, f"{path}: {READER_FILE}", DrafterError))
    _fit_before_building(dcfg, rcfg, target, files, layers_field, str(path / CONFIG_FILE))
    drafter = _build(dcfg, rcfg, target, path)
    state = read_weights(files)
    if drafter.reader_enabled and reader_cfg is not None:
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
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def has_markov_head(path: str | Path) -> bool:
    """Whether the drafter folder at `path` has a Markov head (False: a DFlash drafter), from its config.json
    alone (this tool's `ready_drafter` block when present, else `dflash_config.markov_rank`)."""
    raw = read_json(Path(path) / CONFIG_FILE)
    own, _ = own_blocks(raw, Path(path))
    if own is not None:
        return saved_drafter_config(own, Path(path)).head != "none"
    if not isinstance(raw.get("dflash_config"), dict):
        return False  # not a DSpark folder: its loader says so in one line
    return Fields(raw, str(Path(path) / CONFIG_FILE), DrafterError).sub("dflash_config").integer("markov_rank", 0) > 0


def content_digest(path: str | Path) -> str:
    """sha256 over a drafter folder's config and weights (names and contents): what a sweep row that
    starts from it depends on, the same on every host (each file is hashed once per process). It covers
    the top-level JSON and safetensors files and every file the index names, wherever it sits in the
    folder (`shards/part1.safetensors`); an index entry that leads out of the folder is refused."""
    import hashlib

    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise DrafterError(f"{path}: no {CONFIG_FILE}; expected a DSpark drafter folder")
    files = {p.name: p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".json")}
    if (path / INDEX_FILE).is_file():
        files.update({p.relative_to(path).as_posix(): p for p in weight_files(path)})
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}:{file_digest(files[name])}\n".encode())
    return h.hexdigest()[:16]
