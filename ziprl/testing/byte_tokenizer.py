"""A tokenizer without a model: one id per UTF-8 byte."""

from __future__ import annotations


class ByteTokenizer:
    """A callable-free test tokenizer: one id per UTF-8 byte."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))
