"""Map the paper's layer ids (a 64-layer Qwen3.5 target) onto a target of any depth.

Specs name layers as the paper does: ids of a 64-layer target whose layers run
[GDN, GDN, GDN, attention] x 16. For a target of another depth an id keeps its relative depth
(id / 63 of the way down the stack) and snaps to the nearest suitable layer: any layer for the
drafter's context features, a GDN layer for the reader's state sources. Ties go to the lower
layer. Ids given in `model` space are taken as they are and only checked. In either space the
context id -1 (`EMBEDDINGS`) names the target's token embeddings, the input of its first layer.
"""

from __future__ import annotations

from typing import Sequence

from ready.target.config import EMBEDDINGS

PAPER_NUM_LAYERS = 64
PAPER_LAYER_TYPES: tuple[str, ...] = tuple(
    "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(PAPER_NUM_LAYERS)
)
GDN = "linear_attention"
SPACES = ("paper", "model")


class LayerMapError(ValueError):
    """A layer id that names no suitable layer of the target; the message says what was expected."""


def _check_space(space: str, key: str) -> None:
    if space not in SPACES:
        raise LayerMapError(f"{key}: layer id space {space!r} is unknown; expected 'paper' or 'model'")


def relative_position(paper_id: int, num_layers: int) -> float:
    """Where paper layer `paper_id` sits in a stack of `num_layers` layers (fractional layer id)."""
    if num_layers == 1:
        return 0.0
    return paper_id * (num_layers - 1) / (PAPER_NUM_LAYERS - 1)


def _nearest(position: float, candidates: Sequence[int]) -> int:
    return min(candidates, key=lambda c: (abs(c - position), c))


def _dedupe(ids: Sequence[int]) -> list[int]:
    out: list[int] = []
    for i in ids:
        if i not in out:
            out.append(i)
    return out


def _check_paper_id(i: int, key: str) -> None:
    if not 0 <= i < PAPER_NUM_LAYERS:
        raise LayerMapError(
            f"{key}: layer id {i} is outside the paper's 64-layer target; expected an id in 0..{PAPER_NUM_LAYERS - 1}"
        )


def map_context_layers(ids: Sequence[int], num_layers: int, *, space: str = "paper",
                       key: str = "drafter.context_layers") -> list[int]:
    """Target model layer ids whose hidden output feeds the drafter (ascending, no repeats; -1 = embeddings)."""
    _check_space(space, key)
    if not ids:
        raise LayerMapError(f"{key}: empty; expected at least one layer id")
    out = []
    for i in map(int, ids):
        if i == EMBEDDINGS:
            out.append(EMBEDDINGS)
        elif space == "paper":
            _check_paper_id(i, key)
            out.append(_nearest(relative_position(i, num_layers), range(num_layers)))
        else:
            if not 0 <= i < num_layers:
                raise LayerMapError(
                    f"{key}: model layer id {i} is out of range for a target of {num_layers} layers; "
                    f"expected 0..{num_layers - 1} (or {EMBEDDINGS} for the token embeddings)"
                )
            out.append(i)
    return sorted(_dedupe(out))


def map_state_layers(ids: Sequence[int], layer_types: Sequence[str], *, space: str = "paper",
                     key: str = "reader.layers") -> list[int]:
    """Target model ids of the GDN layers whose committed states the reader reads (ascending, no repeats)."""
    _check_space(space, key)
    if not ids:
        raise LayerMapError(f"{key}: empty; expected at least one GDN layer id")
    gdn = [i for i, t in enumerate(layer_types) if t == GDN]
    n = len(layer_types)
    if not gdn:
        raise LayerMapError(f"{key}: the target has no Gated DeltaNet layers, so there is no state to read")
    out = []
    for i in map(int, ids):
        if space == "paper":
            _check_paper_id(i, key)
            if PAPER_LAYER_TYPES[i] != GDN:
                raise LayerMapError(
                    f"{key}: paper layer {i} is a full-attention layer of the 64-layer target and has no "
                    f"recurrent state; expected a GDN layer id (an id with id % 4 != 3)"
                )
            out.append(_nearest(relative_position(i, n), gdn))
        else:
            if not 0 <= i < n:
                raise LayerMapError(
                    f"{key}: model layer id {i} is out of range for a target of {n} layers; expected one of "
                    f"its GDN layers {gdn}"
                )
            if layer_types[i] != GDN:
                raise LayerMapError(
                    f"{key}: model layer {i} is a full-attention layer and has no recurrent state; expected one "
                    f"of the target's GDN layers {gdn}"
                )
            out.append(i)
    return sorted(_dedupe(out))


def map_inject_layers(ids: Sequence[int], num_draft_layers: int, *, key: str = "reader.inject_layers") -> list[int]:
    """Zero-indexed draft layers that get a reader (negative ids count from the end), ascending."""
    if not ids:
        raise LayerMapError(f"{key}: empty; expected at least one draft layer id")
    out = []
    for i in map(int, ids):
        if not -num_draft_layers <= i < num_draft_layers:
            raise LayerMapError(
                f"{key}: draft layer {i} is beyond the drafter's depth (drafter.num_layers = {num_draft_layers}); "
                f"expected an id in 0..{num_draft_layers - 1} (or -{num_draft_layers}..-1 from the end)"
            )
        out.append(i % num_draft_layers)
    return sorted(_dedupe(out))
