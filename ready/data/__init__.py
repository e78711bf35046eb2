"""Embedded default data: stdlib corpus, tokenizer, pretrained tiny target, benchmark prompts;
conversation datasets (their chat rendering: `ready.data.chat`)."""

from ready.data.benchmarks import BenchmarkError, BenchPrompt, load_suite
from ready.data.conversations import Conversation, ConversationError, LoadReport, load_conversations
from ready.data.corpus import Corpus, CorpusError, load_corpus
from ready.data.default import ensure_default_target, ensure_tokenizer, heldout_prompts, training_prompts

__all__ = ["BenchPrompt", "BenchmarkError", "Corpus", "CorpusError", "load_corpus", "load_suite",
           "ensure_default_target", "ensure_tokenizer", "training_prompts", "heldout_prompts",
           "Conversation", "ConversationError", "LoadReport", "load_conversations"]
