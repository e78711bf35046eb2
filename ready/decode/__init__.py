"""Decoding: the drafter protocol, greedy AR and block speculative decoding, evaluation."""

from ready.decode.engine import BatchResult, Engine, generate, generate_batch
from ready.decode.errors import DecodeError
from ready.decode.evaluate import EvalResult, LosslessWarning, Mismatch, evaluate, run_ar
from ready.decode.ngram import NgramDrafter
from ready.decode.protocol import DraftStep, Drafter
from ready.decode.rounds import Generation, greedy_accept, settle_round

__all__ = [
    "BatchResult", "DecodeError", "DraftStep", "Drafter", "Engine", "EvalResult", "Generation", "LosslessWarning",
    "Mismatch", "NgramDrafter", "evaluate", "generate", "generate_batch", "greedy_accept", "run_ar", "settle_round",
]
