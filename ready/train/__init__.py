"""Drafter training: target-regenerated data, the loss, anchor sampling, the three stages, and
the per-variant pipeline (base DSpark -> ReaDy stage 1 -> stage 2), in one process or
data-parallel under torchrun (ready.train.distributed; the launch is the caller's: `ready launch`)."""

from ready.train.anchors import gather_blocks, sample_anchors
from ready.train.loss import LossTerms, draft_loss, position_weights
from ready.train.pipeline import PipelineError, ensure_base_drafter, read_train_log, train_variant
from ready.train.regen import RegenData, RegenError, build_regen_data, greedy_responses
from ready.train.stages import STAGES, TrainResult, TrainStageError, evaluate_loss, select_trainable, train_stage

__all__ = [
    "LossTerms", "PipelineError", "RegenData", "RegenError", "STAGES", "TrainResult", "TrainStageError",
    "build_regen_data", "draft_loss", "ensure_base_drafter", "evaluate_loss", "gather_blocks", "greedy_responses",
    "position_weights", "read_train_log", "sample_anchors", "select_trainable", "train_stage", "train_variant",
]
