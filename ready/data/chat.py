"""Render conversations with the tokenizer's own chat template: token ids + an assistant-token mask.

Mask method (any template): for each assistant turn i, render the messages before it with the
generation prompt (P_i) and the messages up to and including it (F_i), as text. The template must
satisfy the prefix property: P_i starts F_i (the generation prompt is how the template starts an
assistant turn) and F_i starts the whole conversation's render R (later turns never re-render earlier
ones). Then R[len(P_i):len(F_i)] is the text of assistant turn i. When either check fails,
`ChatTemplateError` says which turn and where the texts part.

Tokens: R is tokenized in pieces cut at each len(P_i) and len(F_i), so a turn's tokens never merge
with the template text around it: the cut at len(P_i) is where, at generation, the prompt ends and
the model's own tokens begin. The mask is True on an assistant turn's tokens up to and including its
last special token (its end-of-turn token, e.g. `<|im_end|>`) and False on the rest (system and user
turns, headers, the template's newline after `<|im_end|>`). A turn without a special token is masked
whole. For a single-turn conversation, `render(...).ids` starts with `prompt_ids` of its user part.
(A template may merge text across such a cut when it tokenizes a whole prompt, as `prompt_ids` does:
the embedded BPE merges the empty think block's final "\\n\\n", so an *earlier* turn of a multi-turn
prompt can tokenize differently in `prompt_ids` than in `render`.)

Thinking: `thinking` is passed to the template as `enable_thinking` (Qwen3.5 and the embedded default
read it; other templates ignore it). With thinking off, the empty think block a Qwen-style template puts
in the generation prompt is template text (mask False); with thinking on, whatever think block the
template renders inside the assistant turn is assistant text (mask True), as the model writes it then.
Templates that drop earlier turns' thinking (Qwen3's: an assistant turn before the last user turn loses
its `<think>` block) re-render earlier turns, so `render` refuses their multi-turn conversations with
one line; `render_turns` makes one sample per assistant turn instead, its context rendered as the
template renders it for that turn (mask on that turn only), which is what the model sees at generation.

Truncation (`max_len`): "right" keeps the first max_len tokens (a cut assistant turn loses its end,
including its end-of-turn token); "left" keeps the last max_len tokens (the latest turns; the
sequence may then start inside a turn); "drop" returns None for a longer sequence. A sample records
whether it was cut; one whose mask has no True left (`n_assistant == 0`) has nothing to train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

TRUNCATE = ("right", "left", "drop")
__all__ = ["ChatSample", "ChatTemplateError", "TRUNCATE", "prompt_ids", "render", "render_text", "render_turns",
           "template_overhead"]
Messages = Sequence[dict[str, str]]


class ChatTemplateError(ValueError):
    """The chat template cannot render these messages as needed; the message is one line saying why."""


@dataclass(frozen=True)
class ChatSample:
    """Token ids of a rendered conversation, True in `mask` on assistant tokens, and whether it was cut."""

    ids: list[int]
    mask: list[bool]
    truncated: bool = False

    @property
    def n_assistant(self) -> int:
        return sum(self.mask)


def render_text(tokenizer: Any, messages: Messages, thinking: bool, add_generation_prompt: bool = False) -> str:
    """The template's text for `messages` (enable_thinking=thinking)."""
    _check_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(f"{type(tokenizer).__name__} has no chat template; expected a tokenizer whose "
                                "tokenizer_config sets chat_template (the embedded default: build it with chat=True)")
    try:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False, enable_thinking=thinking,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as e:  # jinja2 errors and the template's own raise_exception
        raise ChatTemplateError(f"the chat template failed on {len(messages)} messages "
                                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not isinstance(text, str):
        raise ChatTemplateError(f"the chat template returned a {type(text).__name__}; expected text")
    return text


def prompt_ids(tokenizer: Any, messages: Messages, thinking: bool) -> list[int]:
    """Token ids of the prompt for the next assistant turn (the messages + the generation prompt):
    the input to regenerate that turn with the target."""
    if messages and messages[-1].get("role") == "assistant":
        raise ChatTemplateError("prompt_ids got a conversation ending with an assistant turn; expected the "
                                "messages before the turn to generate (ending with a user turn)")
    return _encode(tokenizer, render_text(tokenizer, messages, thinking, add_generation_prompt=True))


def template_overhead(tokenizer: Any, thinking: bool) -> int:
    """Tokens the template adds around one user turn and one assistant answer (their render with empty
    contents): what a length budget for a single-turn conversation must leave to the template."""
    return len(_encode(tokenizer, render_text(tokenizer, [{"role": "user", "content": ""},
                                                          {"role": "assistant", "content": ""}], thinking)))


def render(tokenizer: Any, messages: Messages, thinking: bool, max_len: Optional[int] = None,
           truncate: str = "right") -> Optional[ChatSample]:
    """The whole conversation as one sample, every assistant turn masked True (see the module notes);
    None when truncate="drop" and it is longer than max_len."""
    _check_truncate(max_len, truncate)
    whole = render_text(tokenizer, messages, thinking)
    cuts = []
    for i in _assistant_turns(messages):
        start, full = _turn_span(tokenizer, messages, i, thinking)
        if not whole.startswith(full):
            raise ChatTemplateError(_parted(f"the render of messages[:{i + 1}] (through assistant turn {i + 1})",
                                            full, whole)
                                    + "; the template re-renders earlier turns (e.g. drops their thinking): "
                                      "use render_turns for one sample per assistant turn")
        cuts.append((start, len(full)))
    ids: list[int] = []
    mask: list[bool] = []
    pos = 0
    for start, end in cuts:
        _extend(tokenizer, ids, mask, whole[pos:start], assistant=False)
        _extend(tokenizer, ids, mask, whole[start:end], assistant=True)
        pos = end
    _extend(tokenizer, ids, mask, whole[pos:], assistant=False)
    return _truncate(ChatSample(ids, mask), max_len, truncate)


def render_turns(tokenizer: Any, messages: Messages, thinking: bool, max_len: Optional[int] = None,
                 truncate: str = "left") -> list[Optional[ChatSample]]:
    """One sample per assistant turn: the template's prompt for that turn, then the turn (mask True on it
    only). Works with templates that re-render earlier turns; None for a turn dropped by truncate="drop"."""
    _check_truncate(max_len, truncate)
    out = []
    for i in _assistant_turns(messages):
        start, full = _turn_span(tokenizer, messages, i, thinking)
        ids: list[int] = []
        mask: list[bool] = []
        _extend(tokenizer, ids, mask, full[:start], assistant=False)
        _extend(tokenizer, ids, mask, full[start:], assistant=True)
        out.append(_truncate(ChatSample(ids, mask), max_len, truncate))
    return out


def _assistant_turns(messages: Messages) -> list[int]:
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise ChatTemplateError("the conversation has no assistant turn; expected at least one to mask")
    return turns


def _turn_span(tokenizer: Any, messages: Messages, i: int, thinking: bool) -> tuple[int, str]:
    """(start, full): the render of messages[:i + 1], whose characters from `start` are assistant turn i."""
    prompt = render_text(tokenizer, messages[:i], thinking, add_generation_prompt=True)
    full = render_text(tokenizer, messages[:i + 1], thinking)
    if not full.startswith(prompt):
        raise ChatTemplateError(_parted(f"the generation prompt after messages[:{i}]", prompt, full)
                                + f" (the render through assistant turn {i + 1}); expected the template to "
                                  f"start an assistant turn as its generation prompt does (thinking={thinking})")
    return len(prompt), full


def _parted(what: str, part: str, whole: str) -> str:
    """'<what> is not a prefix ...: they part at character k ('...' vs '...')'."""
    k = next((j for j, (a, b) in enumerate(zip(part, whole)) if a != b), min(len(part), len(whole)))
    return (f"{what} is not a prefix of the longer render: they part at character {k} "
            f"({part[k:k + 20]!r} vs {whole[k:k + 20]!r})")


def _extend(tokenizer: Any, ids: list[int], mask: list[bool], text: str, assistant: bool) -> None:
    """Append the tokens of `text`; for an assistant turn, True up to its last special token (inclusive)."""
    if not text:
        return
    new = _encode(tokenizer, text)
    keep = len(new)
    if assistant:
        special = set(tokenizer.all_special_ids)
        last = max((j for j, t in enumerate(new) if t in special), default=None)
        keep = len(new) if last is None else last + 1
    ids.extend(new)
    mask.extend([assistant and j < keep for j in range(len(new))])


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _truncate(sample: ChatSample, max_len: Optional[int], truncate: str) -> Optional[ChatSample]:
    if max_len is None or len(sample.ids) <= max_len:
        return sample
    if truncate == "drop":
        return None
    if truncate == "right":
        return ChatSample(sample.ids[:max_len], sample.mask[:max_len], truncated=True)
    return ChatSample(sample.ids[-max_len:], sample.mask[-max_len:], truncated=True)


def _check_truncate(max_len: Optional[int], truncate: str) -> None:
    if truncate not in TRUNCATE:
        raise ChatTemplateError(f"truncate={truncate!r}; expected one of {', '.join(TRUNCATE)}")
    if max_len is not None and max_len < 1:
        raise ChatTemplateError(f"max_len={max_len}; expected a positive number of tokens or None")


def _check_messages(messages: Messages) -> None:
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ChatTemplateError(f"message {i} is {m!r:.60}; expected {{'role': str, 'content': str}}")
