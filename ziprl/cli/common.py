"""What several commands share: config overrides from flags, the arguments of a training run, the check of its
inputs (an evaluation's too) that comes before its output directory is touched, and argument types that check a
value when it is parsed (the benchmarks' and the examples' too)."""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path

from ziprl.config import ZipRLConfig


def overrides(flags: dict[str, object], sets: list[str]) -> list[str]:
    """``section.field=value`` overrides of the flags given (None: not given), then the ``--set`` ones."""
    return [f"{k}={v}" for k, v in flags.items() if v is not None] + sets


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments ``train`` and ``launch`` share: config, steps, run directory, SFT checkpoint, overrides."""
    ap.add_argument("--config")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--out")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the ZipRL run in --out (only a directory marked as one by an earlier run, holding "
                         "only what a run writes)")
    ap.add_argument("--sft-checkpoint")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")


def run_flags(args: argparse.Namespace) -> dict[str, object]:
    """The config fields :func:`add_run_arguments`'s flags set."""
    return {"learner.steps": args.steps, "run.out_dir": args.out, "run.sft_checkpoint": args.sft_checkpoint,
            "run.resume": True if args.resume else None}


def command_line(prog: str, argv: list[str]) -> str:
    """The command as a shell would take it back (recorded in the run marker)."""
    return shlex.join([f"python -m {prog}", *argv])


def check_inputs(cfg: ZipRLConfig, deleted: tuple[Path, ...] = ()) -> None:
    """Raise on a bad input of a run (train, launch) or an evaluation before anything is written or deleted
    (seconds, no model loads); an input inside an entry of ``deleted`` (what ``--overwrite`` deletes) too.

    Model and SFT checkpoint directories are checked, not loaded (the embedded default model is converted first,
    once); the dataset's questions are loaded with the loader's own validation; the corpus, when one is known without building it (explicit, a QA file's neighbour,
    a shipped one), is read in full (:func:`~ziprl.retrieval.corpus.scan_corpus`: every line, unique ids) and must
    hold at least ``env.top_k`` and ``retriever.shards`` passages (an index directory alone: its manifest's count);
    index, encoder and embedding paths must exist.
    """
    from ziprl.config import ConfigError, check_top_k
    from ziprl.outputs import refuse_inputs_inside
    from ziprl.policy.models import check_default_model, check_model_paths
    from ziprl.registry import DATASETS
    from ziprl.retrieval.corpus import scan_corpus
    from ziprl.retrieval.datasets import corpus_source, load_questions
    from ziprl.retrieval.index_build import index_differences
    from ziprl.retrieval.index_files import RetrieverError, read_manifest
    from ziprl.retrieval.retriever import rebuild_hint

    r = cfg.retriever
    dataset = None if cfg.data.dataset in DATASETS else cfg.data.dataset  # a path; a name is the package's
    refuse_inputs_inside(deleted, (cfg.model.path, cfg.run.sft_checkpoint, dataset, cfg.data.shared_dir, r.corpus,
                                   r.index_dir, r.encoder, r.embeddings))
    check_model_paths(cfg.model.path, cfg.run.sft_checkpoint)
    load_questions(cfg.data)
    corpus = r.corpus
    if corpus is None and r.index_dir is None:
        found = corpus_source(cfg.data.dataset)  # a lookup, nothing is built (a built corpus is valid by construction)
        corpus = found if isinstance(found, Path) else None
    count = scan_corpus(corpus, None).count if corpus is not None else None  # every line, as the index build reads it
    if r.index_dir is not None and r.corpus is None:
        if not Path(r.index_dir).expanduser().is_dir():
            raise RetrieverError(f"retriever.index_dir {r.index_dir} does not exist; rebuild it with: python -m "
                                 f"ziprl.index build --corpus CORPUS.jsonl --out {r.index_dir}")
        built = read_manifest(Path(r.index_dir).expanduser()) or {}
        count = built.get("count") if isinstance(built.get("count"), int) else None  # the loader checks the rest
    if count is not None:
        check_top_k(cfg.env, count)
        if corpus is not None and r.shards > count:
            raise ConfigError(f"retriever.shards={r.shards} is more than the corpus's {count} passages (a shard "
                              f"holds at least one); set retriever.shards <= {count}")
    if r.index_dir is not None and r.corpus is not None:  # built there: it must not replace another index
        differ = index_differences(r.index_dir, r.index_type, r.shards, r.store_vectors)
        if differ:
            raise RetrieverError(f"retriever.index_dir {r.index_dir} holds an index of other settings "
                                 f"({'; '.join(differ)}); nothing was written: {rebuild_hint(r.index_dir, r.corpus)}")
    for field, value, ok in (("retriever.encoder", r.encoder, Path.is_dir),
                             ("retriever.embeddings", r.embeddings, Path.is_file)):
        if value is not None and not ok(Path(value).expanduser()):
            raise RetrieverError(f"{field} {value} does not exist; set it to an existing path, or null for the default")
    if cfg.model.path is None:  # the embedded default, last (its first use converts it): checked before the first write
        check_default_model(cfg.model)


def at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse ``type``: a ``kind`` (int or float) of at least ``low``, checked when the arguments are parsed
    (so a bad value exits 2 before any work); nan and infinity are refused."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {'an integer' if kind is int else 'a number'}"
                                             ) from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be at least {low}")
        if value == math.inf:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give a finite number")
        return value

    return parse


def listed(item: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse ``type``: comma-separated values, each parsed by ``item`` (e.g. ``at_least(1)``), at least one."""

    def parse(text: str) -> list:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give at least one comma-separated value")
        return values

    return parse


def one_of(choices: Iterable[str], what: str = "") -> Callable[[str], str]:
    """An argparse ``type`` (with :func:`listed`, an item's): a name among ``choices``; ``what`` names the kind
    in the error ("variant ")."""
    known = tuple(choices)

    def parse(text: str) -> str:
        if text not in known:
            raise argparse.ArgumentTypeError(f"unknown {what}{text[:40]!r}; choose from {', '.join(known)}")
        return text

    return parse
