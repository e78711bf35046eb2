"""Architecture config of the hybrid target, in Hugging Face Qwen3.5 (`qwen3_5_text`) field names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from ready.checkpoint_files import Fields


class TargetError(ValueError):
    """Bad input about the target (path, checkpoint, layer id); the message says what was expected."""


# Capture id of the token embeddings (the input of layer 0), beside the layer ids 0..n-1 whose outputs a
# drafter's context can be made of. Features from it depend on their own token only: a drafter context
# of embeddings over the last W tokens sees nothing older (the positive control's setting).
EMBEDDINGS = -1


@dataclass
class HybridConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    layer_types: list[str] = field(default_factory=list)
    full_attention_interval: int = 4
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    # full-attention layers see only the last `sliding_window` keys; None = every earlier key (Qwen3.5).
    # Not a Qwen3.5 knob: the positive control's target (older text must live in the GDN states)
    sliding_window: Optional[int] = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            k = self.full_attention_interval
            self.layer_types = [
                "full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(self.num_hidden_layers)
            ]
        if len(self.layer_types) != self.num_hidden_layers:
            raise TargetError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is {self.num_hidden_layers}"
            )
        if self.sliding_window is not None and int(self.sliding_window) < 1:
            raise TargetError(f"sliding_window is {self.sliding_window}; expected an integer >= 1 or None (every key)")
        bad = sorted(set(self.layer_types) - {"linear_attention", "full_attention"})
        if bad:
            raise TargetError(f"layer_types contains {bad}; expected 'linear_attention' or 'full_attention'")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise TargetError(
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                f"linear_num_key_heads ({self.linear_num_key_heads})"
            )

    # --- derived sizes -------------------------------------------------------------------
    @property
    def gdn_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    @property
    def attn_layer_ids(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def gdn_conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    # --- Hugging Face config.json -----------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("full_attention_interval")
        if d["sliding_window"] is None:  # Qwen3.5's attention: configs (and their hashes) as before the knob
            d.pop("sliding_window")
        else:
            d["use_sliding_window"] = True
        rope = {"rope_type": "default", "rope_theta": d.pop("rope_theta"), "partial_rotary_factor": d.pop("partial_rotary_factor")}
        d.update(
            model_type="qwen3_5_text",
            architectures=["Qwen3_5ForCausalLM"],
            hidden_act="silu",
            attention_bias=False,
            attention_dropout=0.0,
            rope_parameters=rope,
        )
        return d

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "HybridConfig":
        """Read a `qwen3_5_text` config, or a `qwen3_5` one with its `text_config`."""
        return cls(**cls.hf_fields(raw, source))

    @classmethod
    def hf_fields(cls, raw: dict[str, Any], source: str = "config.json") -> dict[str, Any]:
        """The HybridConfig fields a Hugging Face config.json gives, each typed and ranged: one TargetError
        naming the file and the field for anything else (a hand-edited `hidden_size: "abc"` or
        `eos_token_id: "x"`). Nothing is built yet, so a loader can check the sizes against its files first."""
        mt = raw.get("model_type")
        if mt == "qwen3_5":
            raw = Fields(raw, source, TargetError).block("text_config", {})
            mt = raw.get("model_type", "qwen3_5_text")
            source = f"{source} (text_config)"
        if mt != "qwen3_5_text":
            raise TargetError(
                f"{source}: model_type is {mt!r}; expected 'qwen3_5_text' (or 'qwen3_5' with a text_config): "
                "a hybrid Gated DeltaNet + full-attention Qwen3.5 checkpoint"
            )
        f = Fields(raw, source, TargetError)
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise TargetError(f"{source}: hidden_act is {act!r}; expected 'silu'")
        defaults = {x.name: x.default for x in fields(cls)}
        kw: dict[str, Any] = {k: f.integer(k, defaults[k], low=1) for k in _SIZE_FIELDS}
        kw["tie_word_embeddings"] = f.flag("tie_word_embeddings", False)
        kw["rms_norm_eps"] = f.number("rms_norm_eps", defaults["rms_norm_eps"], above=0.0)
        rope = Fields(f.block("rope_parameters", None) or f.block("rope_scaling", None) or {}, source, TargetError,
                      prefix="rope_parameters." if raw.get("rope_parameters") else "rope_scaling.")
        kw["rope_theta"] = rope.number("rope_theta", None, above=0.0)
        if kw["rope_theta"] is None:
            kw["rope_theta"] = f.number("rope_theta", 10000.0, above=0.0)
        kw["partial_rotary_factor"] = rope.number("partial_rotary_factor", None, above=0.0, high=1.0)
        if kw["partial_rotary_factor"] is None:
            kw["partial_rotary_factor"] = f.number("partial_rotary_factor", 0.25, above=0.0, high=1.0)
        rot = kw["head_dim"] * kw["partial_rotary_factor"]
        if not (rot.is_integer() and int(rot) % 2 == 0):
            raise TargetError(f"{source}: head_dim {kw['head_dim']} x partial_rotary_factor "
                              f"{kw['partial_rotary_factor']:g} rotates {rot:g} dimensions; expected an even number")
        if kw["num_attention_heads"] % kw["num_key_value_heads"]:
            raise TargetError(f"{source}: num_attention_heads is {kw['num_attention_heads']}, not a multiple of "
                              f"num_key_value_heads {kw['num_key_value_heads']}; expected whole query groups")
        if raw.get("layer_types") is not None:
            kw["layer_types"] = f.texts("layer_types")
            bad = sorted(set(kw["layer_types"]) - {"linear_attention", "full_attention"})
            if bad or len(kw["layer_types"]) != kw["num_hidden_layers"]:
                raise TargetError(f"{source}: layer_types has {len(kw['layer_types'])} entries{f' with {bad}' if bad else ''}; "
                                  f"expected num_hidden_layers ({kw['num_hidden_layers']}) of 'linear_attention' or "
                                  "'full_attention'")
        eos = raw.get("eos_token_id")
        if isinstance(eos, list):  # several stop tokens: the first is the one this tool stops on
            Fields(raw, source, TargetError).integers("eos_token_id", low=0, high=kw["vocab_size"] - 1)
            eos = eos[0] if eos else None
        kw["eos_token_id"] = Fields({"eos_token_id": eos}, source, TargetError).integer(
            "eos_token_id", None, low=0, high=kw["vocab_size"] - 1)
        kw["pad_token_id"] = f.integer("pad_token_id", None, low=0)
        kw["bos_token_id"] = f.integer("bos_token_id", None, low=0)
        kw["sliding_window"] = None if f.flag("use_sliding_window", None) is False else f.integer(
            "sliding_window", None, low=1)
        return kw


# integer sizes a config.json gives (each >= 1; a missing one keeps HybridConfig's default)
_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings",
                "full_attention_interval")


PRESETS: dict[str, dict[str, Any]] = {
    # The embedded default: pretrains on 2 CPU cores in minutes.
    "tiny": dict(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        max_position_embeddings=2048, rope_theta=10000.0,
    ),
    # Qwen3.5-27B text model shapes (random init; for GPU benchmarks).
    "qwen3_5_27b": dict(
        vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        max_position_embeddings=262144, rope_theta=10_000_000.0,
    ),
}


def preset_config(name: str, overrides: Optional[dict[str, Any]] = None) -> HybridConfig:
    if name not in PRESETS:
        raise TargetError(f"unknown target preset {name!r}; expected one of {sorted(PRESETS)} or a checkpoint directory")
    return HybridConfig(**{**PRESETS[name], **(overrides or {})})
