"""Byte-level BPE tokenizer of the embedded default, trained on the corpus's train split.

Saved as a Hugging Face tokenizer folder (`tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json`) that `transformers.AutoTokenizer.from_pretrained(dir)` loads. Special
tokens: `<|endoftext|>` (EOS, also used as padding and between documents) and `<|mask|>` (the
drafter's mask token). `chat=False` builds this plain variant, without a chat template.

`build_tokenizer(..., chat=True)` builds the chat variant: two more special tokens, `<|im_start|>` and
`<|im_end|>`, at ids 2 and 3 (after EOS and mask, which keep ids 0 and 1; the byte alphabet and the
merges follow, so the vocabulary keeps its size and every other id moves up by two), and
`CHAT_TEMPLATE` (ChatML with Qwen3.5's thinking switch) in the saved `tokenizer_config.json`. The
embedded default builds the chat variant (ready.data.default): its target pretrains on conversations
rendered with this template, its drafters train on them, and its evaluation prompts are rendered with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ready.data.corpus import Doc

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # ids 0 and 1, in this order
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
CHAT_TOKENS = (IM_START_TOKEN, IM_END_TOKEN)  # ids 2 and 3 in the chat variant

# ChatML, with Qwen3.5's thinking switch: `enable_thinking=False` puts an empty think block after the
# assistant header (in the generation prompt and in every rendered assistant turn alike); left out or
# True, the assistant header is followed by whatever the model writes. Every turn renders the same
# wherever it stands (no earlier thinking is dropped), so a conversation's render starts with the
# render of each of its prefixes: ready.data.chat.render masks a whole multi-turn conversation at once.
CHAT_TEMPLATE = (
    "{%- set think_off = enable_thinking is defined and enable_thinking is false %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and think_off %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if think_off %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def _specials(chat: bool) -> tuple[str, ...]:
    return SPECIAL_TOKENS + CHAT_TOKENS if chat else SPECIAL_TOKENS


def train_bpe(docs: Iterable[Doc], vocab_size: int, chat: bool = False) -> Any:
    """Train a byte-level BPE (`tokenizers.Tokenizer`) on the documents' texts (chat: with the ChatML tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = _specials(chat)
    if vocab_size < 256 + len(specials) + 1:
        raise ValueError(f"bad value at key 'corpus.vocab_size': {vocab_size}; expected at least "
                         f"{256 + len(specials) + 1} (256 bytes + special tokens + one merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in docs), trainer=trainer)
    return tok


def save_hf_tokenizer(tok: Any, out_dir: str | os.PathLike) -> dict[str, int]:
    """Write `tok` as a Hugging Face tokenizer folder; return the special token ids.

    A `tok` that holds the ChatML tokens is saved with `CHAT_TEMPLATE`, inside `tokenizer_config.json`
    (not a separate `chat_template.jinja`, so the files copied next to a target carry it).
    """
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chat = tok.token_to_id(IM_START_TOKEN) is not None and tok.token_to_id(IM_END_TOKEN) is not None
    extra: dict[str, Any] = {}
    if chat:
        extra = {"additional_special_tokens": list(CHAT_TOKENS), "chat_template": CHAT_TEMPLATE}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   mask_token=MASK_TOKEN, clean_up_tokenization_spaces=False, **extra)
    fast.model_max_length = 1 << 20
    fast.save_pretrained(str(out), save_jinja_files=False)
    ids = special_token_ids(fast)
    special_map: dict[str, Any] = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "mask_token": MASK_TOKEN}
    if chat:
        special_map["additional_special_tokens"] = list(CHAT_TOKENS)
        ids.update(chat_token_ids(fast))
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return ids


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """Ids of EOS, pad and mask in a loaded Hugging Face tokenizer."""
    return {"eos_token_id": int(tokenizer.convert_tokens_to_ids(EOS_TOKEN)),
            "pad_token_id": int(tokenizer.convert_tokens_to_ids(EOS_TOKEN)),
            "mask_token_id": int(tokenizer.convert_tokens_to_ids(MASK_TOKEN))}


def chat_token_ids(tokenizer: Any) -> dict[str, int]:
    """Ids of `<|im_start|>` and `<|im_end|>` (the end of an assistant turn) in a chat-variant tokenizer."""
    ids = {"im_start_token_id": tokenizer.convert_tokens_to_ids(IM_START_TOKEN),
           "im_end_token_id": tokenizer.convert_tokens_to_ids(IM_END_TOKEN)}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        raise ValueError(f"the tokenizer has no {IM_START_TOKEN} / {IM_END_TOKEN} tokens; expected one built "
                         "with build_tokenizer(..., chat=True)")
    return {k: int(v) for k, v in ids.items()}


class TokenizerError(ValueError):
    """A tokenizer folder that cannot be read; the message names the file and what was expected."""


TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Load a saved tokenizer folder with `transformers.AutoTokenizer`; a garbled file (a hand-edited or
    truncated tokenizer.json) is one TokenizerError naming it, never a traceback from inside transformers."""
    from transformers import AutoTokenizer

    from ready.checkpoint_files import read_json

    folder = Path(path)
    for name in TOKENIZER_JSON:
        if (folder / name).is_file():
            read_json(folder / name, "a Hugging Face tokenizer file", TokenizerError)
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # tokenizers' Exception, ValueError, KeyError, OSError: all mean an unusable folder
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise TokenizerError(f"{folder}: not a readable tokenizer ({type(e).__name__}: {first}); expected a Hugging "
                             f"Face tokenizer folder ({', '.join(TOKENIZER_JSON)}) as transformers saves it") from None


def build_tokenizer(docs: Iterable[Doc], vocab_size: int, out_dir: str | os.PathLike,
                    chat: bool = False) -> dict[str, int]:
    """Train on `docs` and save to `out_dir` (plus `special_tokens.json` with the ids); chat: the ChatML variant."""
    tok = train_bpe(docs, vocab_size, chat=chat)
    ids = save_hf_tokenizer(tok, out_dir)
    ids["vocab_size"] = tok.get_vocab_size()
    (Path(out_dir) / "special_tokens.json").write_text(json.dumps(ids, indent=2) + "\n")
    return ids
