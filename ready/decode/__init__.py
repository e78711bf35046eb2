"""Decoding: the drafter protocol, greedy AR and block speculative decoding, evaluation."""

from ready.decode.engine import Engine, Generation, generate, greedy_accept, settle_round
from ready.decode.errors import DecodeError
from ready.decode.evaluate import EvalResult, LosslessWarning, Mismatch, evaluate, run_ar
from ready.decode.ngram import NgramDrafter
from ready.decode.protocol import DraftStep, Drafter

__all__ = [
    "DecodeError", "DraftStep", "Drafter", "Engine", "EvalResult", "Generation", "LosslessWarning", "Mismatch",
    "NgramDrafter", "evaluate", "generate", "greedy_accept", "run_ar", "settle_round",
]
