"""Embedded default data: stdlib corpus, tokenizer, pretrained tiny target, benchmark prompts."""

from ready.data.benchmarks import BenchmarkError, BenchPrompt, load_suite
from ready.data.corpus import Corpus, CorpusError, load_corpus
from ready.data.default import ensure_default_target, ensure_tokenizer, heldout_prompts, training_prompts

__all__ = ["BenchPrompt", "BenchmarkError", "Corpus", "CorpusError", "load_corpus", "load_suite",
           "ensure_default_target", "ensure_tokenizer", "training_prompts", "heldout_prompts"]
