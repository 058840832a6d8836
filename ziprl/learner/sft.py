"""Cold-start SFT (paper Appendix "Cold Start Details", Algorithm 1 Stage 1) on transition-level demos.

A demo transition is one assistant turn of a correct, well-formed trajectory: ``messages`` (the chat prompt the
policy saw at that turn) and ``response`` (the assistant text). Its training row is
``chat_template(messages, add_generation_prompt=True) + tokens(response) + end-of-turn``, with the loss on the
response and end-of-turn tokens only, exactly the tokens the policy generates at that turn.

:func:`run_sft` (``python -m ziprl.sft --demos FILE --out DIR``) trains ``sft.epochs`` epochs (``sft.micro_batch``
rows per optimiser step, lr ``sft.lr``), logs TensorBoard scalars to ``DIR/tb`` and writes the model to
``DIR/model``. :func:`stage1_dir` is where ``launch`` caches Stage 1 (demos + SFT) per configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ziprl.boundary import UserError
from ziprl.config import ZipRLConfig
from ziprl.env.chat import chat_ids, text_ids
from ziprl.paths import cache_root

if TYPE_CHECKING:
    from ziprl.learner.trainer import Trainer

log = logging.getLogger(__name__)

DEMO_COLUMNS = ("messages", "response")
_SENTINEL = "ZIPRL_END_OF_TURN_PROBE"


class DemoFileError(UserError, ValueError):
    """The demonstration file is missing or malformed; the message says what is wrong."""


@dataclass
class SFTRow:
    """One transition as a training row: loss on ``input_ids[response_start:]``."""

    input_ids: list[int]
    response_start: int


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template with the assistant header appended.

    Special-token text inside a message stays plain text, as in generation (:func:`ziprl.env.chat.chat_ids`).
    """
    return chat_ids(tokenizer, messages)


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Token ids the chat template writes right after an assistant message (``<|im_end|>`` for ChatML).

    Found by rendering a probe conversation and taking the text after the assistant content (trailing
    whitespace stripped); a template that writes nothing there falls back to the tokenizer's EOS token.
    """
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
    text = tokenizer.apply_chat_template(probe, tokenize=False)
    suffix = text[text.rindex(_SENTINEL) + len(_SENTINEL):].rstrip() or (tokenizer.eos_token or "")
    if not suffix:
        raise ValueError("the chat template ends assistant turns with nothing and the tokenizer has no EOS token")
    return list(tokenizer(suffix, add_special_tokens=False)["input_ids"])


def sft_rows(examples: Sequence[dict[str, Any]], tokenizer: Any, max_seq_len: int) -> list[SFTRow]:
    """One row per transition ``{"messages": [...], "response": str}``.

    A row longer than ``max_seq_len`` loses its leftmost prompt tokens; a transition whose response alone
    needs more than ``max_seq_len - 1`` positions is skipped (with a warning), never cut.
    """
    eot = end_of_turn_ids(tokenizer)
    rows, skipped = [], 0
    for ex in examples:
        prompt = chat_prompt_ids(tokenizer, ex["messages"])
        response = text_ids(tokenizer, ex["response"]) + eot  # split: a response can never hold an end-of-turn
        if len(response) > max_seq_len - 1:
            skipped += 1
            continue
        prompt = prompt[max(0, len(prompt) + len(response) - max_seq_len):]
        rows.append(SFTRow(prompt + response, len(prompt)))
    if skipped:
        log.warning("sft_rows: skipped %d of %d transitions whose response exceeds max_seq_len=%d",
                    skipped, len(examples), max_seq_len)
    return rows


def read_demos(path: str | Path) -> list[dict[str, Any]]:
    """Transitions from a demo Parquet file (columns ``messages`` = JSON chat messages, ``response``; others ignored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        raise DemoFileError(f"demo file {path} is a directory; pass the demo Parquet file (`python -m ziprl.demos` "
                            "writes one)")
    if not path.is_file():
        raise DemoFileError(f"demo file {path} does not exist (write one with `python -m ziprl.demos`)")
    try:
        table = pq.read_table(path, columns=list(DEMO_COLUMNS))
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise DemoFileError(f"{path} is not a demo Parquet file with columns {DEMO_COLUMNS}: {exc}") from None
    if table.num_rows == 0:
        raise DemoFileError(f"demo file {path} has no rows")
    examples = []
    for i, row in enumerate(table.to_pylist()):
        try:
            messages = json.loads(row["messages"])
        except (TypeError, json.JSONDecodeError) as exc:
            raise DemoFileError(f"{path} row {i}: `messages` is not a JSON string ({exc})") from None
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not ok:
            raise DemoFileError(f"{path} row {i}: `messages` must be a non-empty list of {{role, content}} objects")
        if not isinstance(row["response"], str) or not row["response"]:
            raise DemoFileError(f"{path} row {i}: `response` must be a non-empty string")
        examples.append({"messages": messages, "response": row["response"]})
    return examples


def length_grouped_steps(lengths: Sequence[int], size: int, rng: Any, mega: int = 50) -> list[list[int]]:
    """One epoch of row indices in steps of ``size``, rows of similar length together (HF Trainer's
    ``group_by_length``): shuffle, sort each run of ``mega`` steps' rows by length, cut it into steps, shuffle the
    steps. A step pads to its longest row, so this pads far less than a plain shuffle."""
    order = rng.permutation(len(lengths)).tolist()
    steps = []
    for s in range(0, len(order), mega * size):
        block = sorted(order[s : s + mega * size], key=lambda i: lengths[i])
        steps += [block[k : k + size] for k in range(0, len(block), size)]
    return [steps[i] for i in rng.permutation(len(steps))]


def sft_trainer(cfg: ZipRLConfig) -> Trainer:
    """The Stage 1 trainer over ``cfg.model``: ``sft.lr``, constant, no KL term (no reference model)."""
    from ziprl.learner.trainer import Trainer
    from ziprl.policy.models import resolve_model_path

    learner = dataclasses.replace(cfg.learner, lr=cfg.sft.lr, beta=0.0, warmup_steps=0)
    return Trainer(dataclasses.replace(cfg, learner=learner), resolve_model_path(cfg.model))


def run_sft(cfg: ZipRLConfig, demos_path: str | Path, out_dir: str | Path, trainer: Trainer | None = None) -> Path:
    """Stage 1: fine-tune ``cfg.model`` on the demos; returns ``<out_dir>/model`` (an HF checkpoint).

    ``trainer``: an :func:`sft_trainer` built beforehand (e.g. while the demos were synthesised); None builds one.

    ``sft.epochs`` passes over the shuffled transitions (seed ``learner.seed``; rows of similar length share a step,
    :func:`length_grouped_steps`), one optimiser step per ``sft.micro_batch`` rows at constant lr ``sft.lr``;
    scalars go to ``<out_dir>/tb``.
    """
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from ziprl.learner.distributed import rank
    from ziprl.policy.models import load_tokenizer, resolve_model_path

    examples = read_demos(demos_path)  # fail on a bad file before any model loads
    out_dir = Path(out_dir)
    model_path = resolve_model_path(cfg.model) if trainer is None else trainer.model_path
    rows = sft_rows(examples, load_tokenizer(model_path, cfg.model.trust_remote_code), cfg.sft.max_seq_len)
    if not rows:
        raise DemoFileError(f"no transition of {demos_path} fits sft.max_seq_len={cfg.sft.max_seq_len}")

    trainer = trainer or sft_trainer(cfg)
    size = cfg.sft.micro_batch
    rng = np.random.default_rng(cfg.learner.seed)
    writer = SummaryWriter(str(out_dir / "tb")) if rank() == 0 else None
    lengths = [len(r.input_ids) for r in rows]
    with tqdm(total=cfg.sft.epochs * math.ceil(len(rows) / size), desc="sft", disable=rank() != 0) as bar:
        for epoch in range(cfg.sft.epochs):
            for step in length_grouped_steps(lengths, size, rng):
                stats = trainer.sft_step([rows[i] for i in step])  # forward passes of learner.micro_batch_turns rows
                if writer is not None:
                    for key in ("loss", "grad_norm", "lr", "tokens"):
                        writer.add_scalar(f"sft/{key}", stats[key], trainer.global_step)
                bar.set_postfix(epoch=epoch, loss=f"{stats['loss']:.4f}")
                bar.update()
    if writer is not None:
        writer.close()
    return trainer.save_pretrained(out_dir / "model")


def stage1_dir(cfg: ZipRLConfig) -> Path:
    """Cache directory of Stage 1 for this configuration (demos, SFT, env and model settings)."""
    key = json.dumps({"demos": dataclasses.asdict(cfg.demos) | {"out": None}, "sft": dataclasses.asdict(cfg.sft),
                      "env": dataclasses.asdict(cfg.env), "model": cfg.model.path, "seed": cfg.learner.seed,
                      "retriever": dataclasses.asdict(cfg.retriever)}, sort_keys=True)
    return cache_root(cfg.model.cache_dir) / "stage1" / hashlib.sha256(key.encode()).hexdigest()[:12]
