"""Cold-start SFT (paper Appendix "Cold Start Details", Algorithm 1 Stage 1) on transition-level demos.

A demo transition is one assistant turn of a correct, well-formed trajectory: ``messages`` (the chat prompt the
policy saw at that turn) and ``response`` (the assistant text). Its training row is
``chat_template(messages, add_generation_prompt=True) + tokens(response) + end-of-turn``, with the loss on the
response and end-of-turn tokens only, exactly the tokens the policy generates at that turn.

:func:`run_sft` (``python -m ziprl.sft --demos FILE --out DIR``) trains ``sft.epochs`` epochs (``sft.micro_batch``
rows per optimiser step, lr ``sft.lr``), logs TensorBoard scalars to ``DIR/tb`` and writes the model to
``DIR/model``. :func:`stage1_dir` is where ``launch`` caches Stage 1 (demos + SFT) per configuration and
demonstration data (its builders hold :func:`ziprl.outputs.locked` on it, so a second one waits for the first);
:func:`check_weights` records the sha256 of the weights it built beside them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ziprl.boundary import UserError
from ziprl.config import ZipRLConfig
from ziprl.env.chat import chat_ids, text_ids
from ziprl.env.demos import is_partial_file
from ziprl.learner.run_files import CHECKPOINT_ENTRIES, TB_ENTRIES
from ziprl.outputs import entries, own_dir, sweep_leftovers
from ziprl.paths import cache_root, file_sha256, hash_file_into, not_a_file

if TYPE_CHECKING:
    from ziprl.learner.trainer import Trainer

log = logging.getLogger(__name__)

DEMO_COLUMNS = ("messages", "response")
SFT_WRITES = ("model", "tb", "checkpoints")  # what run_sft writes into its out_dir
# an HF model directory: save_pretrained of the model and its tokenizer writes it whole (atomically), with files
# whose names depend on the model family (weights, tokenizer, a remote-code model's own .py files) and named chat
# templates in one subdirectory
MODEL_ENTRIES = r"model(?:/[^/]+|/additional_chat_templates/[^/]+)?"
is_sft_entry = entries(MODEL_ENTRIES, TB_ENTRIES, CHECKPOINT_ENTRIES)
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
    problem = not_a_file(path)
    if problem:
        raise DemoFileError(f"demo file {path} {problem}; pass the demo Parquet file (write one with "
                            "`python -m ziprl.demos`)")
    if is_partial_file(path):
        raise DemoFileError(f"{path} is the progress of a stopped ziprl.demos, not finished demos; continue it with "
                            "`python -m ziprl.demos --resume` and pass the file it writes")
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


def run_sft(cfg: ZipRLConfig, demos_path: str | Path, out_dir: str | Path, trainer: Trainer | None = None,
            resume: bool = False, stop: Callable[[], None] | None = None, rows: list[SFTRow] | None = None) -> Path:
    """Stage 1: fine-tune ``cfg.model`` on the demos; returns ``<out_dir>/model`` (an HF checkpoint).

    ``trainer``: an :func:`sft_trainer` built beforehand (e.g. while the demos were synthesised); None builds one.
    ``rows``: the demos' :func:`fitting_rows`, computed beforehand (as ``ziprl.sft`` does before it claims
    ``out_dir``); None computes them.
    ``out_dir`` follows the output rule (:func:`ziprl.outputs.own_dir`): it is marked as an SFT run, and ``model``,
    ``tb`` or ``checkpoints`` already there are replaced only in a directory so marked.

    ``sft.epochs`` passes over the shuffled transitions (seed ``learner.seed``; rows of similar length share a step,
    :func:`length_grouped_steps`), one optimiser step per ``sft.micro_batch`` rows at constant lr ``sft.lr``;
    scalars go to ``<out_dir>/tb``. Every ``sft.checkpoint_every`` steps a checkpoint goes to
    ``<out_dir>/checkpoints`` (:mod:`ziprl.learner.checkpoint`), which ``resume`` continues from exactly, with the
    same demos and settings (checked before it loads); they are deleted once the model is written. ``stop`` is
    called after each step: a :class:`ziprl.loop.stop.Stop` it raises (a SIGINT or SIGTERM) is a checkpoint of
    that step, then the stop.
    """
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    from ziprl.learner.checkpoint import (
        in_checkpoint_dtype,
        load_checkpoint,
        remove_checkpoints,
        save_checkpoint,
    )
    from ziprl.learner.distributed import rank
    from ziprl.policy.models import resolve_model_path

    if rows is None:  # fail on a bad file before any model loads
        model_path = resolve_model_path(cfg.model) if trainer is None else trainer.model_path
        rows = fitting_rows(cfg, read_demos(demos_path), model_path, demos_path)
    out_dir = own_dir(out_dir, "sft", SFT_WRITES, mark=rank() == 0)  # nothing written over what is not SFT's
    if rank() == 0:  # the caller holds out_dir's lock: a model or checkpoint write a kill left is removed
        sweep_leftovers(out_dir, is_sft_entry)
    rng = np.random.default_rng(cfg.learner.seed)
    lengths = [len(r.input_ids) for r in rows]
    steps = [s for _ in range(cfg.sft.epochs) for s in length_grouped_steps(lengths, cfg.sft.micro_batch, rng)]
    order = sft_order(cfg, rows)
    if resume:
        check_sft_resume(out_dir, order)
        cfg = in_checkpoint_dtype(cfg, out_dir)  # it goes on in the dtype it was written in

    trainer = trainer or sft_trainer(cfg)
    done = load_checkpoint(trainer, out_dir)["steps_done"] if resume else 0  # optimiser steps taken
    writer = SummaryWriter(str(out_dir / "tb"), purge_step=trainer.global_step + 1 if resume else None) \
        if rank() == 0 else None  # a resumed run's events replace those logged after its checkpoint
    per_epoch = math.ceil(len(rows) / cfg.sft.micro_batch)
    with tqdm(total=len(steps), initial=done, desc="sft", disable=rank() != 0) as bar:
        try:
            while done < len(steps):
                stats = trainer.sft_step([rows[i] for i in steps[done]])  # passes of learner.micro_batch_turns rows
                done += 1
                if writer is not None:
                    for key in ("loss", "grad_norm", "lr", "tokens"):
                        writer.add_scalar(f"sft/{key}", stats[key], trainer.global_step)
                bar.set_postfix(epoch=(done - 1) // per_epoch, loss=f"{stats['loss']:.4f}")
                bar.update()
                if cfg.sft.checkpoint_every and done % cfg.sft.checkpoint_every == 0 and done < len(steps):
                    save_checkpoint(trainer, out_dir, order | {"steps_done": done}, keep=1)
                if stop is not None:
                    stop()
        except KeyboardInterrupt as exc:  # a Stop from ``stop`` (between steps) says whether to checkpoint
            if getattr(exc, "checkpoint", False):
                path = save_checkpoint(trainer, out_dir, order | {"steps_done": done}, keep=1)
                print(f"\n[sft] stopped after step {done} of {len(steps)}: checkpoint {path}; --resume continues "
                      "from it", flush=True)
            raise
        finally:
            if writer is not None:
                writer.close()
    model = trainer.save_pretrained(out_dir / "model")
    if rank() == 0 and (out_dir / "checkpoints").is_dir():
        remove_checkpoints(out_dir)  # only a resume needs them, and the model is written
    return model


def demo_rows(cfg: ZipRLConfig, examples: Sequence[dict[str, Any]], model_path: str | Path) -> list[SFTRow]:
    """The demo transitions as training rows, tokenized by ``model_path``'s tokenizer (:func:`sft_rows`)."""
    from ziprl.policy.models import load_tokenizer

    return sft_rows(examples, load_tokenizer(model_path, cfg.model.trust_remote_code), cfg.sft.max_seq_len)


def fitting_rows(cfg: ZipRLConfig, examples: Sequence[dict[str, Any]], model_path: str | Path,
                 demos_path: str | Path) -> list[SFTRow]:
    """:func:`demo_rows`; DemoFileError when no transition of ``demos_path`` fits ``sft.max_seq_len``."""
    rows = demo_rows(cfg, examples, model_path)
    if not rows:
        raise DemoFileError(f"no transition of {demos_path} fits sft.max_seq_len={cfg.sft.max_seq_len}; raise "
                            "sft.max_seq_len (--set sft.max_seq_len=N) or make demos with shorter episodes")
    return rows


def sft_order(cfg: ZipRLConfig, rows: Sequence[SFTRow]) -> dict[str, Any]:
    """What fixes an SFT's step order (the rows' tokens, the epochs, the rows per step, the seed): its checkpoints'
    data position, with ``steps_done``, so a resume with other demos or settings is refused."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps([r.response_start, r.input_ids]).encode())
    return {"rows_sha256": h.hexdigest(), "epochs": cfg.sft.epochs, "micro_batch": cfg.sft.micro_batch,
            "seed": cfg.learner.seed}


def check_sft_resume(out_dir: Path, order: dict[str, Any]) -> None:
    """CheckpointError, before any model loads, unless ``out_dir``'s latest checkpoint was written by an SFT run
    of the same step order (:func:`sft_order`) and no finished model is there."""
    from ziprl.learner.checkpoint import CheckpointError, checkpoint_state, latest_checkpoint

    if (Path(out_dir) / "model").exists():  # written whole by save_pretrained: a resume would replace it
        raise CheckpointError(f"{out_dir} holds the model of a finished SFT ({Path(out_dir) / 'model'}); a resume "
                              "would write over it: use that model, or pass --overwrite to train again")
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        raise CheckpointError(f"{out_dir} has no SFT checkpoint to resume from; start it again without resuming")
    saved = checkpoint_state(ckpt)["data_position"]
    differ = [k for k in order if saved.get(k) != order[k]]
    if differ or not isinstance(saved.get("steps_done"), int):
        what = "the demonstration rows (demos file, tokenizer or sft.max_seq_len)" if "rows_sha256" in differ else \
            ", ".join(f"{k} {saved.get(k)!r} then, {order[k]!r} now" for k in differ) or "its position"
        raise CheckpointError(f"SFT checkpoint {ckpt} does not fit this run: {what} changed; resume with the demos "
                              "and settings it started with, or start over (--overwrite)")


class Stage1CacheError(UserError, RuntimeError):
    """A cached Stage-1 model is not the one its cache directory built; the message names the directory to delete."""


def stage1_dir(cfg: ZipRLConfig) -> Path:
    """Cache directory of Stage 1 for this configuration (demos, SFT, env, model and retriever settings) and the
    content of the data its demonstrations are played on (:func:`demo_data_sha256`)."""
    sft = dataclasses.asdict(cfg.sft)
    del sft["checkpoint_every"]  # how often it checkpoints does not change the model
    demos = dataclasses.asdict(cfg.demos) | {"out": None}
    del demos["checkpoint_every"]  # nor how often the demos run saves its progress
    key = json.dumps({"demos": demos, "sft": sft,
                      "env": dataclasses.asdict(cfg.env), "model": cfg.model.path, "seed": cfg.learner.seed,
                      "retriever": dataclasses.asdict(cfg.retriever), "data": demo_data_sha256(cfg)}, sort_keys=True)
    return cache_root(cfg.model.cache_dir) / "stage1" / hashlib.sha256(key.encode()).hexdigest()[:12]


def stage1_resumable(root: Path) -> bool:
    """Whether the Stage-1 cache ``root`` holds an SFT that stopped before its model was written, with the demos it
    trained on: building it again continues that SFT from its checkpoint."""
    return (root / "demos.parquet").is_file() and (root / "checkpoints" / "latest").is_file() \
        and not (root / "model").exists()


def demo_data_sha256(cfg: ZipRLConfig) -> str:
    """sha256 of what the demonstrations are made from (as :func:`ziprl.env.demos.build_demos` reads it): every
    question of ``cfg.demos.datasets`` (id, text, answers, supporting titles, source) and the bytes of the corpus file
    the teacher searches, when the retriever reads one."""
    from ziprl.retrieval.datasets import load_dataset, retriever_config_for

    h = hashlib.sha256()
    for name in cfg.demos.datasets:
        h.update(name.encode())
        for ex in load_dataset(name, cfg.data.shared_dir, max_question_chars=cfg.data.max_question_chars):
            h.update(json.dumps(dataclasses.asdict(ex), sort_keys=True).encode())
    first = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, dataset=cfg.demos.datasets[0]))
    corpus = retriever_config_for(first).corpus
    if corpus:
        h.update(bytes.fromhex(file_sha256(corpus)))
    return h.hexdigest()


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over a model directory's safetensors files (name and bytes of each, in name order): which weights
    a result is about."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no .safetensors file")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        hash_file_into(h, f)
    return h.hexdigest()


def check_weights(model_dir: str | Path) -> str:
    """The model's :func:`weights_sha256`, written beside it (``<model_dir>.sha256``) the first time; raises
    :class:`Stage1CacheError` when it differs from the one written (the model changed under its cache key)."""
    from ziprl.paths import atomic_write_text

    model_dir = Path(model_dir)
    record, digest = model_dir.with_name(f"{model_dir.name}.sha256"), weights_sha256(model_dir)
    if not record.is_file():
        atomic_write_text(record, digest + "\n")
    elif record.read_text().strip() != digest:
        raise Stage1CacheError(f"the weights of {model_dir} changed since {record} was written; delete "
                               f"{model_dir.parent} to rebuild that Stage-1 model")
    return digest
