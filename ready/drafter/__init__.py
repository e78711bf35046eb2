"""The DSpark block drafter (backbone over target features + Markov head) and its DSpark-format checkpoints."""

from ready.drafter.checkpoint import is_drafter_folder, load_drafter, save_drafter
from ready.drafter.heads import HEAD_TYPES, SequenceHeadError, build_head
from ready.drafter.layer_map import LayerMapError, map_context_layers, map_inject_layers, map_state_layers
from ready.drafter.model import DrafterError, DSparkDrafter, target_fingerprint

__all__ = [
    "DSparkDrafter", "DrafterError", "HEAD_TYPES", "LayerMapError", "SequenceHeadError", "build_head",
    "is_drafter_folder", "load_drafter", "map_context_layers", "map_inject_layers", "map_state_layers",
    "save_drafter", "target_fingerprint",
]
