"""Decode prompt token ids for the viewer with a ``tokenizer.json`` (the ``tokenizers`` library; no torch).

As in training and evaluation, where a prompt longer than the model's context never reaches the model, a prompt
longer than the context of the tokenizer's model is not decoded (one note says so): no run of that model wrote it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from ziprl.boundary import one_line
from ziprl.view.data import Run, ViewerError

UNKNOWN_CONTEXT = 32_768  # prompt tokens decoded when no config.json beside the tokenizer names its model's context


def default_tokenizer_dir() -> Path | None:
    """The converted embedded policy's directory, if it is already in the cache (nothing is converted here)."""
    from ziprl.paths import cache_root
    from ziprl.policy.models import DEFAULT_MODEL_NAME

    found = sorted((cache_root() / "models").glob(f"{DEFAULT_MODEL_NAME}-*/tokenizer.json"))
    return found[0].parent if found else None


def model_context(tokenizer_file: Path) -> int:
    """``max_position_embeddings`` of the config.json beside ``tokenizer_file`` (what the engines take as the model's
    context), or :data:`UNKNOWN_CONTEXT` when there is none."""
    try:
        value = json.loads((tokenizer_file.parent / "config.json").read_text(encoding="utf-8"))["max_position_embeddings"]
    except (OSError, ValueError, TypeError, KeyError):
        return UNKNOWN_CONTEXT
    return value if isinstance(value, int) and value > 0 else UNKNOWN_CONTEXT


def _first_prompt(run: Run) -> list[int] | None:
    for s in run.sources:
        for turns in s.table.column("turns").slice(0, 20).to_pylist():
            for t in turns or []:
                if t.get("prompt_ids"):
                    return t["prompt_ids"]
    return None


def make_decoder(spec: str | None, run: Run) -> Callable[[list[int]], str] | None:
    """A prompt decoder from ``spec`` (a directory, 'none', or None for the cached default), or None.

    A decoder whose output does not look like a ZipRL prompt (another model's tokenizer) is dropped with a note.
    """
    if spec == "none":
        return None
    path = Path(spec).expanduser() if spec else default_tokenizer_dir()
    if path is None:
        return None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"--tokenizer {spec}: no tokenizer.json there; give a HF model/tokenizer directory "
                                "or --tokenizer none")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise ViewerError(f"--tokenizer: {file} is not a tokenizer.json the tokenizers library reads "
                         f"({one_line(exc)}); give the directory of the model that wrote the run, "
                         "or --tokenizer none") from None
    vocab, context = tok.get_vocab_size(with_added_tokens=True), model_context(file)
    noted = False  # the note on a prompt past the context was printed

    def decode(ids: list[int]) -> str:
        """The text of ``ids`` ("" past the model's context); ids this tokenizer does not have (negative, past its
        vocabulary) are left out."""
        nonlocal noted
        if len(ids) > context:
            if not noted:
                noted = True
                print(f"[view] note: a prompt of {len(ids)} tokens is longer than the {context}-token context of the "
                      f"model at {file.parent}; prompts that long are not decoded", file=sys.stderr)
            return ""
        return tok.decode([i for i in ids if 0 <= i < vocab], skip_special_tokens=False)

    sample = _first_prompt(run)
    if sample is not None and len(sample) <= context and "Question: " not in decode(sample):
        print(f"[view] note: the tokenizer at {file.parent} does not decode these prompts (another model?); "
              "pass --tokenizer DIR of the model that wrote them", file=sys.stderr)
        return None
    return decode
