"""Chat prompts as token ids in which only the chat template writes special tokens.

Message contents (questions, passages, notes, the model's own earlier turns) are tokenized with special tokens
split, so text such as ``<|im_start|>`` or ``<|endoftext|>`` inside a message stays plain text and can never
become a control token. Needs only a tokenizer object (no torch).
"""

from __future__ import annotations

from typing import Any

from ziprl.env.protocol import scrub

_MARK = "\ue000ziprl-content-{}\ue001"  # private-use placeholders: where each message's content goes


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of plain text: no BOS/EOS added, special-token strings split into ordinary tokens."""
    if not text:
        return []
    return list(tokenizer.encode(scrub(text), add_special_tokens=False, split_special_tokens=True))


def template_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of chat-template text, whose special tokens are parsed."""
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def chat_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template; contents tokenized by :func:`text_ids`.

    The template is rendered once with a placeholder per content; the template's own text between them is
    tokenized with special tokens parsed, each content with them split.
    """
    marks = [_MARK.format(i) for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template([{**m, "content": k} for m, k in zip(messages, marks, strict=True)],
                                             tokenize=False, add_generation_prompt=add_generation_prompt)
    ids, pos = [], 0
    for m, mark in zip(messages, marks, strict=True):
        at = rendered.find(mark, pos)
        if at < 0:
            raise ValueError("the chat template does not copy message contents verbatim; ZipRL needs one that does")
        ids += template_ids(tokenizer, rendered[pos:at]) + text_ids(tokenizer, m["content"])
        pos = at + len(mark)
    return ids + template_ids(tokenizer, rendered[pos:])
