"""The DSpark block drafter (backbone over target features + sequence head) and its checkpoints."""

from ready.drafter.heads import HEAD_TYPES, SequenceHeadError, build_head
from ready.drafter.layer_map import LayerMapError, map_context_layers, map_inject_layers, map_state_layers
from ready.drafter.model import DrafterError, DSparkDrafter, load_drafter, target_fingerprint

__all__ = [
    "DSparkDrafter", "DrafterError", "HEAD_TYPES", "LayerMapError", "SequenceHeadError", "build_head",
    "load_drafter", "map_context_layers", "map_inject_layers", "map_state_layers", "target_fingerprint",
]
